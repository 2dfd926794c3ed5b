// tokref.js: the reference encoders the tokenizer tests and benchmark compare
// shardline's trainer/tokenizer with. NODE_PATH names the node_modules holding
// the npm packages `tokenizers` (Hugging Face's Rust core) and `tiktoken`
// (OpenAI's Rust encoder in WASM); `make tokref-deps` installs them in bin/tokref.
//
//   node tokref.js hf TOKENIZER_JSON DOCS_JSONL OUT_BIN [DECODED_JSONL]
//       encode each document (a JSON string a line) without added BOS/EOS;
//       with DECODED_JSONL, decode each one's ids back (special tokens kept)
//   node tokref.js tiktoken RANKS SPECIALS_JSON PATTERN DOCS_JSONL OUT_BIN
//       encode with allowed_special="all"
//   node tokref.js hf-decode TOKENIZER_JSON IDS_BIN OUT_JSONL
//       decode each document's ids (special tokens kept)
//   node tokref.js bench-hf TOKENIZER_JSON DOCS_JSONL SECONDS
//   node tokref.js bench-tiktoken RANKS SPECIALS_JSON PATTERN DOCS_JSONL SECONDS
//       encode the documents, each alone, repeatedly (one core: run it with
//       RAYON_NUM_THREADS=1); print MB per CPU second and per wall second
//
// OUT_BIN is, for each document, a little-endian uint32 count and the ids.
'use strict';
const fs = require('fs');

function readDocs(path) {
  return fs.readFileSync(path, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

function writeIds(path, all) {
  let n = 0;
  for (const ids of all) n += 1 + ids.length;
  const buf = Buffer.alloc(4 * n);
  let off = 0;
  for (const ids of all) {
    buf.writeUInt32LE(ids.length, off); off += 4;
    for (const id of ids) { buf.writeUInt32LE(id, off); off += 4; }
  }
  fs.writeFileSync(path, buf);
}

function readIds(path) {
  const buf = fs.readFileSync(path);
  const out = [];
  for (let off = 0; off < buf.length;) {
    const n = buf.readUInt32LE(off); off += 4;
    const ids = [];
    for (let i = 0; i < n; i++) { ids.push(buf.readUInt32LE(off)); off += 4; }
    out.push(ids);
  }
  return out;
}

function tiktoken(ranks, specials, pattern) {
  const { Tiktoken } = require('tiktoken');
  return new Tiktoken(fs.readFileSync(ranks, 'utf8'), JSON.parse(fs.readFileSync(specials, 'utf8')), pattern);
}

// bench encodes the documents (encodeAll takes them all) until seconds of
// wall time have passed and prints MB/s of CPU time (the process's, every
// thread's: a busy machine's other work does not count) and of wall time.
async function bench(encodeAll, docsPath, seconds) {
  const docs = readDocs(docsPath);
  let bytes = 0;
  for (const d of docs) bytes += Buffer.byteLength(d, 'utf8');
  await encodeAll(docs); // warm up: caches, JIT
  let n = 0;
  const start = process.hrtime.bigint();
  const cpu0 = process.cpuUsage();
  let el = 0;
  do {
    await encodeAll(docs);
    n++;
    el = Number(process.hrtime.bigint() - start) / 1e9;
  } while (el < seconds);
  const cpu = process.cpuUsage(cpu0);
  const cpuS = (cpu.user + cpu.system) / 1e6;
  console.log(`${(bytes * n / cpuS / 1e6).toFixed(2)} MB/cpu-s ${(bytes * n / el / 1e6).toFixed(2)} MB/s`);
}

async function main() {
  const [mode, ...a] = process.argv.slice(2);
  switch (mode) {
    case 'hf': {
      const { Tokenizer } = require('tokenizers');
      const tok = Tokenizer.fromFile(a[0]);
      const docs = readDocs(a[1]);
      const encs = await tok.encodeBatch(docs, { addSpecialTokens: false });
      const ids = encs.map((e) => e.getIds());
      writeIds(a[2], ids);
      if (a[3]) {
        const texts = await tok.decodeBatch(ids, false);
        fs.writeFileSync(a[3], texts.map((t) => JSON.stringify(t)).join('\n') + '\n');
      }
      break;
    }
    case 'hf-decode': {
      const { Tokenizer } = require('tokenizers');
      const tok = Tokenizer.fromFile(a[0]);
      const texts = await tok.decodeBatch(readIds(a[1]), false);
      fs.writeFileSync(a[2], texts.map((t) => JSON.stringify(t)).join('\n') + '\n');
      break;
    }
    case 'tiktoken': {
      const enc = tiktoken(a[0], a[1], a[2]);
      writeIds(a[4], readDocs(a[3]).map((d) => Array.from(enc.encode(d, 'all'))));
      enc.free();
      break;
    }
    case 'bench-hf': {
      const { Tokenizer } = require('tokenizers');
      const tok = Tokenizer.fromFile(a[0]);
      await bench((docs) => tok.encodeBatch(docs, { addSpecialTokens: false }), a[1], Number(a[2]));
      break;
    }
    case 'bench-tiktoken': {
      const enc = tiktoken(a[0], a[1], a[2]);
      await bench((docs) => { for (const d of docs) enc.encode(d, 'all'); }, a[3], Number(a[4]));
      break;
    }
    default:
      console.error('usage: see the comment at the top of tokref.js');
      process.exit(2);
  }
}

main().catch((e) => { console.error(e && e.stack ? e.stack : String(e)); process.exit(1); });
