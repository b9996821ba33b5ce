//! The `multilock` binary against real servers from the test kit: one
//! test binary (one link) for every concern, as the library's suite.

mod audit;
mod common;
mod deployments;
mod inspect;
mod list;
mod passwords;
mod unlock;
mod watch;
