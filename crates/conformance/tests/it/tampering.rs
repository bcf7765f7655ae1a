//! Tampering only SQLite allows: values a CHECK would refuse, written with the checks
//! switched off, and text that is not UTF-8. The portable rows are the suite's.

use crate::{Db, suite::tampering::refused_after};

/// Values a CHECK would refuse, written with the checks switched off, and text that is
/// not UTF-8: a contract violation, not an opaque SQLite error or a lease answer.
#[test]
fn out_of_domain_and_non_utf8_values_are_refused() {
    refused_after::<Db>("PRAGMA ignore_check_constraints = ON; UPDATE outbox SET state = 'parked'");
    refused_after::<Db>(
        "PRAGMA ignore_check_constraints = ON; UPDATE outbox SET attempt_count = -1",
    );
    refused_after::<Db>("UPDATE operations SET provider = CAST(x'ff6f70656e6169' AS TEXT)");
    refused_after::<Db>(
        "PRAGMA ignore_check_constraints = ON; UPDATE local_receipts SET finalized_by = CAST(x'ff' AS TEXT)",
    );
}
