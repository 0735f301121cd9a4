//! Integration tests: the real `symtrace-server` binary, real debuginfod
//! clients (elfutils' debuginfod-find, gdb), elfutils' own server as an
//! upstream, and both storage combinations (SQLite + local directory,
//! PostgreSQL + S3 via scripts/test-services.sh).

use symtrace_testkit as support;

mod amplification;
mod bad_input;
mod collector;
mod conformance;
mod crash;
mod deploy;
mod durability;
mod federation;
mod file_ids;
mod gdb;
mod hostile;
mod limits;
mod memory;
mod profiles;
mod profiles_bad_input;
mod quality;
mod query;
mod query_bad_input;
mod replicas;
mod scale;
mod symbolize;
mod tenancy;
mod trust;
