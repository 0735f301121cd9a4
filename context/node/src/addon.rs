//! The Node-API glue: arguments in, `ids` and symtrace-context out.

use crate::ids;
use std::ffi::{c_char, c_void};
use std::ptr;

use napi_sys::*;
use symtrace_context::Ids;

/// Bounds of `publishProcess`'s resource: attributes, key and value bytes.
const MAX_ATTRIBUTES: u32 = 128;
const MAX_KEY: usize = 256;
const MAX_VALUE: usize = 4096;

type Result<T> = std::result::Result<T, &'static str>;

struct Args<const N: usize> {
    values: [napi_value; N],
    count: usize,
}

#[inline(always)]
unsafe fn args<const N: usize>(env: napi_env, info: napi_callback_info) -> Args<N> {
    let mut count = N;
    let mut values = [ptr::null_mut(); N];
    let status = unsafe {
        napi_get_cb_info(
            env,
            info,
            &mut count,
            values.as_mut_ptr(),
            ptr::null_mut(),
            ptr::null_mut(),
        )
    };
    if status != Status::napi_ok {
        count = 0;
    }
    Args {
        values,
        count: count.min(N),
    }
}

impl<const N: usize> Args<N> {
    #[inline(always)]
    fn get(&self, i: usize) -> Option<napi_value> {
        (i < self.count).then(|| self.values[i])
    }
}

/// Copies a string argument of exactly `2 * BYTES` characters and parses it.
#[inline(always)]
unsafe fn hex_arg<const BYTES: usize>(
    env: napi_env,
    value: Option<napi_value>,
    what: &'static str,
) -> Result<[u8; BYTES]> {
    let value = value.ok_or(what)?;
    // One byte more than needed: a longer string shows as too long.
    let mut buf = [0u8; 34];
    let mut len = 0usize;
    let cap = (2 * BYTES + 2).min(buf.len());
    let status =
        unsafe { napi_get_value_string_latin1(env, value, buf.as_mut_ptr().cast(), cap, &mut len) };
    if status != Status::napi_ok {
        return Err(what);
    }
    ids::parse_hex::<BYTES>(&buf[..len]).ok_or(what)
}

#[inline(always)]
unsafe fn flags_arg(env: napi_env, value: Option<napi_value>) -> Result<u8> {
    const WHAT: &str = "traceFlags must be an integer from 0 to 255";
    let Some(value) = value else {
        return Ok(0);
    };
    let mut flags = 0u32;
    if unsafe { napi_get_value_uint32(env, value, &mut flags) } != Status::napi_ok {
        // Not a number: `undefined` is the optional argument left out (the
        // type check only on this path, not on every call).
        let mut kind = ValueType::napi_null;
        unsafe { napi_typeof(env, value, &mut kind) };
        return if kind == ValueType::napi_undefined {
            Ok(0)
        } else {
            Err(WHAT)
        };
    }
    if flags > 255 {
        return Err(WHAT);
    }
    Ok(flags as u8)
}

#[inline(always)]
unsafe fn ids_args(env: napi_env, a: &Args<3>) -> Result<Ids> {
    let trace =
        unsafe { hex_arg::<16>(env, a.get(0), "traceId must be a string of 32 hex digits")? };
    let span = unsafe { hex_arg::<8>(env, a.get(1), "spanId must be a string of 16 hex digits")? };
    let flags = unsafe { flags_arg(env, a.get(2))? };
    Ok(Ids::new(trace, span, flags))
}

unsafe fn throw(env: napi_env, message: &str) -> napi_value {
    let mut text = Vec::with_capacity(message.len() + 1);
    text.extend_from_slice(message.as_bytes());
    text.push(0);
    unsafe { napi_throw_type_error(env, ptr::null(), text.as_ptr().cast()) };
    ptr::null_mut()
}

unsafe fn undefined(env: napi_env) -> napi_value {
    let mut v = ptr::null_mut();
    unsafe { napi_get_undefined(env, &mut v) };
    v
}

unsafe fn int(env: napi_env, n: i32) -> napi_value {
    let mut v = ptr::null_mut();
    unsafe { napi_create_int32(env, n, &mut v) };
    v
}

unsafe extern "C" fn enter(env: napi_env, info: napi_callback_info) -> napi_value {
    let a = unsafe { args::<3>(env, info) };
    match unsafe { ids_args(env, &a) } {
        Ok(ids) => match ids::enter(&ids) {
            Ok(token) => unsafe { int(env, token) },
            Err(ids::TooDeep) => unsafe {
                throw(
                    env,
                    "enter nested deeper than 65536 on this thread: exit is missing",
                )
            },
        },
        Err(e) => unsafe { throw(env, e) },
    }
}

unsafe extern "C" fn exit(env: napi_env, info: napi_callback_info) -> napi_value {
    let a = unsafe { args::<1>(env, info) };
    let mut token = -1i32;
    let ok = a
        .get(0)
        .is_some_and(|v| unsafe { napi_get_value_int32(env, v, &mut token) == Status::napi_ok });
    if !ok {
        return unsafe { throw(env, "exit takes the token enter returned") };
    }
    ids::exit(token);
    unsafe { undefined(env) }
}

unsafe extern "C" fn set(env: napi_env, info: napi_callback_info) -> napi_value {
    let a = unsafe { args::<3>(env, info) };
    match unsafe { ids_args(env, &a) } {
        Ok(ids) => {
            symtrace_context::set(&ids);
            unsafe { undefined(env) }
        }
        Err(e) => unsafe { throw(env, e) },
    }
}

unsafe extern "C" fn clear(env: napi_env, _info: napi_callback_info) -> napi_value {
    symtrace_context::set(&Ids::default());
    unsafe { undefined(env) }
}

unsafe fn string(env: napi_env, s: &str) -> napi_value {
    let mut v = ptr::null_mut();
    unsafe { napi_create_string_utf8(env, s.as_ptr().cast(), s.len() as isize, &mut v) };
    v
}

unsafe extern "C" fn current(env: napi_env, _info: napi_callback_info) -> napi_value {
    let ids = symtrace_context::current();
    let mut out = ptr::null_mut();
    unsafe {
        if !ids.active {
            napi_get_null(env, &mut out);
            return out;
        }
        napi_create_array_with_length(env, 3, &mut out);
        napi_set_element(env, out, 0, string(env, &ids::to_hex(&ids.trace_id)));
        napi_set_element(env, out, 1, string(env, &ids::to_hex(&ids.span_id)));
        napi_set_element(env, out, 2, int(env, ids.trace_flags.into()));
    }
    out
}

/// The string value of `value` (coerced), at most `max` bytes.
unsafe fn text(env: napi_env, value: napi_value, max: usize) -> Result<String> {
    let mut s = ptr::null_mut();
    if unsafe { napi_coerce_to_string(env, value, &mut s) } != Status::napi_ok {
        return Err("resource values must convert to strings");
    }
    let mut len = 0usize;
    unsafe { napi_get_value_string_utf8(env, s, ptr::null_mut(), 0, &mut len) };
    if len > max {
        return Err("a resource key is over 256 bytes or a value over 4096");
    }
    let mut buf = vec![0u8; len + 1];
    let mut written = 0usize;
    unsafe { napi_get_value_string_utf8(env, s, buf.as_mut_ptr().cast(), buf.len(), &mut written) };
    buf.truncate(written);
    String::from_utf8(buf).map_err(|_| "resource strings must be UTF-8")
}

unsafe fn resource(env: napi_env, object: napi_value) -> Result<Vec<(String, String)>> {
    let mut kind = ValueType::napi_undefined;
    unsafe { napi_typeof(env, object, &mut kind) };
    if kind == ValueType::napi_undefined || kind == ValueType::napi_null {
        return Ok(Vec::new());
    }
    if kind != ValueType::napi_object {
        return Err("resource must be an object of attributes");
    }
    let mut keys = ptr::null_mut();
    let mut n = 0u32;
    unsafe {
        if napi_get_property_names(env, object, &mut keys) != Status::napi_ok
            || napi_get_array_length(env, keys, &mut n) != Status::napi_ok
        {
            return Err("resource must be an object of attributes");
        }
    }
    if n > MAX_ATTRIBUTES {
        return Err("resource has over 128 attributes");
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut key = ptr::null_mut();
        let mut value = ptr::null_mut();
        unsafe {
            napi_get_element(env, keys, i, &mut key);
            napi_get_property(env, object, key, &mut value);
            let mut vkind = ValueType::napi_undefined;
            napi_typeof(env, value, &mut vkind);
            if matches!(
                vkind,
                ValueType::napi_undefined | ValueType::napi_null | ValueType::napi_object
            ) {
                continue; // OpenTelemetry's scalar attributes only
            }
            out.push((text(env, key, MAX_KEY)?, text(env, value, MAX_VALUE)?));
        }
    }
    Ok(out)
}

unsafe extern "C" fn publish_process(env: napi_env, info: napi_callback_info) -> napi_value {
    let a = unsafe { args::<2>(env, info) };
    let result = (|| unsafe {
        let name = text(env, a.get(0).ok_or("serviceName is required")?, MAX_VALUE)?;
        let mut attributes = vec![("service.name".to_owned(), name)];
        if let Some(r) = a.get(1) {
            attributes.extend(
                resource(env, r)?
                    .into_iter()
                    .filter(|(k, _)| k != "service.name"),
            );
        }
        Ok(attributes)
    })();
    let attributes = match result {
        Ok(a) => a,
        Err(e) => return unsafe { throw(env, e) },
    };
    let pairs: Vec<(&str, &str)> = attributes
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    match symtrace_context::process::publish(&pairs, &[]) {
        Ok(()) => unsafe { undefined(env) },
        Err(e) => unsafe {
            let mut message = ptr::null_mut();
            let text = format!("publishing the process context failed: {e}");
            napi_create_string_utf8(env, text.as_ptr().cast(), text.len() as isize, &mut message);
            let mut error = ptr::null_mut();
            napi_create_error(env, ptr::null_mut(), message, &mut error);
            napi_throw(env, error);
            ptr::null_mut()
        },
    }
}

type Callback = unsafe extern "C" fn(napi_env, napi_callback_info) -> napi_value;

/// Node-API's entry point: Node.js calls it once per thread that loads the
/// addon (the main thread and each worker), with that thread's `exports`.
///
/// # Safety
/// Called by Node.js with a valid environment and exports object.
#[no_mangle]
pub unsafe extern "C" fn napi_register_module_v1(env: napi_env, exports: napi_value) -> napi_value {
    let functions: [(&[u8], Callback); 6] = [
        (b"enter\0", enter),
        (b"exit\0", exit),
        (b"set\0", set),
        (b"clear\0", clear),
        (b"current\0", current),
        (b"publishProcess\0", publish_process),
    ];
    for (name, callback) in functions {
        let mut f = ptr::null_mut();
        unsafe {
            napi_create_function(
                env,
                name.as_ptr().cast::<c_char>(),
                (name.len() - 1) as isize,
                Some(callback),
                ptr::null_mut::<c_void>(),
                &mut f,
            );
            napi_set_named_property(env, exports, name.as_ptr().cast(), f);
        }
    }
    exports
}

/// The Node-API version the addon needs (4: Node.js 10.16 and later).
#[no_mangle]
pub extern "C" fn node_api_module_get_api_version_v1() -> i32 {
    4
}
