"""The validate stage: probe and held-out texts, the original model's answers, the candidate as served (alone
and batched), the parity metrics, and a latency reading."""
