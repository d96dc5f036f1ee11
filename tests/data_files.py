"""The data files the tests read, in data_cache/. scripts/fetch_data.sh puts them there (linked
from a local copy when it finds one, else downloaded); importing this module runs it when a file is
missing, so the tests never skip for want of data: without the files they fail, saying why."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data_cache")
SHAKESPEARE = os.path.join(DATA, "tinyshakespeare.txt")
GPT2_ENCODER = os.path.join(DATA, "gpt2", "encoder.json")
GPT2_VOCAB = os.path.join(DATA, "gpt2", "vocab.bpe")

if not all(os.path.exists(f) for f in (SHAKESPEARE, GPT2_ENCODER, GPT2_VOCAB)):
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "fetch_data.sh")], check=True)
