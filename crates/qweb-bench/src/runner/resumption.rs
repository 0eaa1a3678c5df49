//! Experiments H (resumption: clients that resume 80% of the time, qweb vs nginx vs h2o) and
//! I (two qweb nodes behind the client's round-robin, ticket keys shared through the key
//! server or not).

use super::*;

impl Runner {
    pub(super) fn exp_h(&mut self) -> Result<()> {
        Ok(())
    }

    pub(super) fn exp_i(&mut self) -> Result<()> {
        Ok(())
    }
}
