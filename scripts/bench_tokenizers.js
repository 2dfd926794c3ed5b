// Hugging Face tokenizers (npm "tokenizers", its Rust core) encoding the text
// fields of a JSON lines file with GPT-2's tokenizer.json, in batches of about
// a MiB of text. The file is read and parsed first, untimed: the figures are
// the encoding alone. Prints "hf BYTES TOKENS CPU_SECONDS WALL_SECONDS" (CPU
// over every thread the library runs; tokens without end-of-text markers).
// Usage: node bench_tokenizers.js TOKENIZER_JSON CORPUS_JSONL
const fs = require("fs");
const readline = require("readline");
const { Tokenizer } = require("tokenizers");

async function main() {
  const [tokPath, corpus] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(tokPath);
  const rl = readline.createInterface({ input: fs.createReadStream(corpus), crlfDelay: Infinity });
  const batches = [];
  let batch = [], size = 0, bytes = 0;
  for await (const line of rl) {
    if (!line.trim()) continue;
    const text = JSON.parse(line).text;
    bytes += Buffer.byteLength(text);
    batch.push(text);
    if ((size += text.length) >= 1 << 20) {
      batches.push(batch);
      batch = [];
      size = 0;
    }
  }
  if (batch.length) batches.push(batch);
  let tokens = 0;
  const cpu0 = process.cpuUsage(), t0 = process.hrtime.bigint();
  for (const b of batches) {
    for (const e of await tok.encodeBatch(b)) tokens += e.getIds().length;
  }
  const cpu = process.cpuUsage(cpu0), wall = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`hf ${bytes} ${tokens} ${(cpu.user + cpu.system) / 1e6} ${wall}`);
}
main().catch((e) => { console.error(e); process.exit(1); });
