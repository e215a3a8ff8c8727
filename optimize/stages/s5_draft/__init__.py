"""The draft stage: the artifact directory as the server will load it before any graph is chosen (its tokenizer
files and the manifest without parity, draft.py), and how quantize and validate run a graph from it as served
(served.py) and judge its answers against the reference (parity.py)."""
