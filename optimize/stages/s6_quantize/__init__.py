"""The quantize stage: per-token INT8 (batch-invariant) or per-tensor dynamic INT8, searched for parity or
carried from another artifact, and word-embedding tables as INT8 rows."""
