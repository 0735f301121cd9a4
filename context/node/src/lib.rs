//! The Node-API addon of `@symtrace/context` (see `index.js`): each call
//! publishes into this thread's OTEP 4947 record, so every JS thread (the
//! main thread, each worker) publishes its own span. No allocation on the
//! per-span paths: IDs are copied from the JS strings into stack buffers.
//!
//! - `enter(traceId, spanId, flags) → token`, `exit(token)`: nested
//!   publishing, the token is where the replaced context was saved;
//! - `set(traceId, spanId, flags)`, `clear()`: publish without saving
//!   (integrations that keep their own stack, like the context manager);
//! - `current() → [traceId, spanId, flags] | null`: what is published;
//! - `publishProcess(serviceName, resource?)`: the process context.

mod ids;
// Node-API's functions are the node executable's: only the addon links.
#[cfg(not(test))]
mod addon;
