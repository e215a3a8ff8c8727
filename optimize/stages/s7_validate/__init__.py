"""The validate stage: the artifact's graph served as built and held to its thresholds on the held-out texts
(validate.py); `multiverse validate` checks an existing artifact the same way (artifact.py)."""
