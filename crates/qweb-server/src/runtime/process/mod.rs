//! The process: its pid file and signals (`control`), the service manager (`notify`), its
//! open-file limit and fd reserve (`fd_limit`, `fd`), and the binary upgrade that hands its
//! sockets to a new process (`upgrade`).

pub mod control;
pub(crate) mod fd;
pub mod fd_limit;
pub mod notify;
pub mod upgrade;
