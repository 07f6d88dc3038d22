"""CPU test of tune_table.py: joins efopt's tune stats and PyTorch baselines into the table
and its geometric means. Run by `cargo test --test tune`."""

import io
import json
import os
import sys
import tempfile
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(__file__))
import tune_table as t  # noqa: E402


def stats(us):
    return "remark: something\n" + json.dumps({"chunks": [{"passes": [
        {"pass": "rank", "counters": {}},
        {"pass": "tune", "counters": {"groups": [{"chosen": {"us": us}}]}}]}]})


def main():
    d = tempfile.mkdtemp()
    open(os.path.join(d, "ngpt.B1.json"), "w").write(stats(5.0))
    open(os.path.join(d, "lora.B1.json"), "w").write(stats(20.0))
    open(os.path.join(d, "mha_decode.B1.json"), "w").write(stats(30.0))
    json.dump([
        {"workload": "ngpt", "impl": "torch-eager", "us": 20.0},
        {"workload": "ngpt", "impl": "torch.compile", "us": 10.0},
        {"workload": "lora", "impl": "torch-eager", "us": 10.0},
        {"workload": "lora", "impl": "torch.compile", "us": 40.0},
        {"workload": "mha_decode", "impl": "torch-eager", "us": 90.0},
        {"workload": "mha_decode", "impl": "sdpa-flash", "us": 33.0},
    ], open(os.path.join(d, "torch.B1.json"), "w"))
    out = io.StringIO()
    with redirect_stdout(out):
        t.main(d)
    text = out.getvalue()
    # ngpt: 10 / 5 = 2x; lora: 10 / 20 = 0.5x; geometric mean 1.00x; decode 33 / 30 = 1.10x.
    assert "2.00x" in text and "0.50x" in text, text
    assert "non-attention configurations vs the fastest PyTorch: 1.00x" in text, text
    assert "mha_decode vs SDPA flash: min 1.10x" in text, text
    assert t.tuned_us(os.path.join(d, "missing.json")) is None
    print("tune_table ok")


if __name__ == "__main__":
    main()
