"""The engine side, in the order a request runs through it: service.py admits it, tokenizes it
(tokenization.py) and queues it; batcher.py fills a batch by tokens and runs it on one engine thread through
model.py (padding, the onnxruntime session in session.py, the task's reduction); rows come back. preflight.py
checks an artifact on this host (hostinfo.py) before it is served."""
