//! Integration tests of `switchyard-parsers`, one module per area.

mod fuzz;
mod malformed;
mod output;
mod reasoning_fixtures;
mod round_trip;
mod support;
mod tool_fixtures;
