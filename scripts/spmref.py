"""spmref.py: the SentencePiece reference for trainer/tokenizer's tests
(Debian's python3-sentencepiece, Google's C++ library).

    python3 spmref.py MODEL DOCS_JSONL OUT_BIN

encodes each document (a JSON string a line) and writes, for each, a
little-endian uint32 count and the ids.
"""
import json
import struct
import sys

import sentencepiece as spm


def main():
    model, docs_path, out_path = sys.argv[1:4]
    sp = spm.SentencePieceProcessor(model_file=model)
    with open(docs_path, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    with open(out_path, "wb") as out:
        for ids in sp.encode(docs):
            out.write(struct.pack("<I", len(ids)))
            out.write(struct.pack("<%dI" % len(ids), *ids))


if __name__ == "__main__":
    main()
