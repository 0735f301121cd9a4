//! The C ABI (`include/symtrace_ctx.h`): C and C++ programs link
//! `libsymtrace_context.a` and publish contexts the same way.

use std::ffi::{c_char, c_int, CStr};

use crate::record::Ids;
use crate::{process, thread};

/// Publishes a span as this thread's context; returns what was published
/// before, for `symtrace_ctx_exit`.
///
/// # Safety
/// `trace_id` must point to 16 readable bytes and `span_id` to 8.
#[no_mangle]
pub unsafe extern "C" fn symtrace_ctx_enter(
    trace_id: *const u8,
    span_id: *const u8,
    trace_flags: u8,
) -> Ids {
    // SAFETY: the caller's promise.
    let (t, s) = unsafe { (*trace_id.cast::<[u8; 16]>(), *span_id.cast::<[u8; 8]>()) };
    let mut previous = Ids::default();
    thread::replace(&Ids::new(t, s, trace_flags), &mut previous);
    previous
}

/// Restores what `symtrace_ctx_enter` returned.
///
/// # Safety
/// `previous` must point to a value `symtrace_ctx_enter` returned on this
/// thread.
#[no_mangle]
pub unsafe extern "C" fn symtrace_ctx_exit(previous: *const Ids) {
    // SAFETY: the caller's promise.
    thread::set(unsafe { &*previous });
}

/// Publishes the process context with `service.name`; 0, or -errno.
///
/// # Safety
/// `service_name` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn symtrace_ctx_publish_process(service_name: *const c_char) -> c_int {
    // SAFETY: the caller's promise.
    let name = unsafe { CStr::from_ptr(service_name) }.to_string_lossy();
    match process::publish(&[("service.name", &name)], &[]) {
        Ok(()) => 0,
        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
    }
}
