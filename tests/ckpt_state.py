"""Editing a checkpoint's state.json in a test: write_state writes the members with a correct
state_sha256 (the SHA-256 of the text with its own 64 digits read as '0', as the writer computes
it), so that the loader gets past its integrity check to the check a test is about."""
import hashlib
import json
import os


def write_state(ckpt, state):
    st = dict(state)
    st.pop("state_sha256", None)
    st["state_sha256"] = "0" * 64   # last, as the writer puts it
    text = json.dumps(st, indent=1)
    digest = hashlib.sha256(text.encode()).hexdigest()
    with open(os.path.join(ckpt, "state.json"), "w") as f:
        f.write(text[: text.rindex("0" * 64)] + digest + text[text.rindex("0" * 64) + 64:])
