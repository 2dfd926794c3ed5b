// Hugging Face tokenizers (npm "tokenizers", its Rust core) encoding the text
// fields of a JSON lines file with GPT-2's tokenizer.json: prints
// "hf BYTES TOKENS CPU_SECONDS WALL_SECONDS" (CPU over every thread the
// library runs), the tokens not counting end-of-text markers.
// Usage: node bench_tokenizers.js TOKENIZER_JSON CORPUS_JSONL
const fs = require("fs");
const readline = require("readline");
const { Tokenizer } = require("tokenizers");

async function main() {
  const [tokPath, corpus] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(tokPath);
  const rl = readline.createInterface({ input: fs.createReadStream(corpus), crlfDelay: Infinity });
  let batch = [], bytes = 0, tokens = 0, size = 0;
  const cpu0 = process.cpuUsage(), t0 = process.hrtime.bigint();
  const flush = async () => {
    const out = await tok.encodeBatch(batch);
    for (const e of out) tokens += e.getIds().length;
    batch = [];
    size = 0;
  };
  for await (const line of rl) {
    if (!line.trim()) continue;
    const text = JSON.parse(line).text;
    bytes += Buffer.byteLength(text);
    batch.push(text);
    size += text.length;
    if (size >= 1 << 20) await flush();
  }
  if (batch.length) await flush();
  const cpu = process.cpuUsage(cpu0), wall = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`hf ${bytes} ${tokens} ${(cpu.user + cpu.system) / 1e6} ${wall}`);
}
main().catch((e) => { console.error(e); process.exit(1); });
