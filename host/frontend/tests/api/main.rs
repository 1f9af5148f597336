//! Integration tests of the frontend's public API, one module per area.

mod aggregate;
mod canonical;
mod encoders;
mod fixtures;
mod garbage;
mod hostile;
mod previous_response;
mod support;
