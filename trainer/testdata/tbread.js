// tbread.js reads a TensorBoard event file with outside code, for the trainer's
// tests (TestEventsReadByOutsideReaders): the record framing and its CRC-32C
// checks by the npm package @roboflow/tfrecords (its crc32c, maskCrc and
// readInt64), the Event and Summary messages by protobufjs from a schema
// written here from TensorFlow's published field numbers (event.proto,
// summary.proto). It prints the events as JSON, each scalar's value as a
// string (so that NaN survives), and exits 1 on a CRC that does not match or
// a record cut short.
//
// usage: node tbread.js NODE_MODULES_DIR EVENT_FILE
const path = require("path");
const fs = require("fs");
const [modulesArg, file] = process.argv.slice(2);
const modules = path.resolve(modulesArg);
const tf = require(path.join(modules, "@roboflow/tfrecords/src/tensorFlowHelpers.js"));
const protobuf = require(path.join(modules, "protobufjs"));

const root = protobuf.parse(`
syntax = "proto3";
message Event {
  double wall_time = 1;
  int64 step = 2;
  string file_version = 3;
  Summary summary = 5;
}
message Summary {
  message Value {
    string tag = 1;
    float simple_value = 2;
  }
  repeated Value value = 1;
}
`, { keepCase: true }).root;
const Event = root.lookupType("Event");

const b = fs.readFileSync(file);
const out = [];
let pos = 0;
function fail(msg) {
  process.stderr.write(`${file}: ${msg}\n`);
  process.exit(1);
}
while (pos < b.length) {
  if (b.length - pos < 16) fail(`record at byte ${pos} cut short`);
  const lenBuf = b.slice(pos, pos + 8);
  const n = tf.readInt64(lenBuf);
  if (tf.maskCrc(tf.crc32c(lenBuf)) !== b.readUInt32LE(pos + 8)) fail(`length CRC of the record at byte ${pos}`);
  if (n > b.length - pos - 16) fail(`record at byte ${pos} holds ${n} bytes, past the end`);
  const data = b.slice(pos + 12, pos + 12 + n);
  if (tf.maskCrc(tf.crc32c(data)) !== b.readUInt32LE(pos + 12 + n)) fail(`data CRC of the record at byte ${pos}`);
  const ev = Event.decode(data);
  out.push({
    wall_time: ev.wall_time,
    step: String(ev.step),
    file_version: ev.file_version,
    values: ((ev.summary && ev.summary.value) || []).map((v) => ({ tag: v.tag, value: String(v.simple_value) })),
  });
  pos += 16 + n;
}
process.stdout.write(JSON.stringify(out));
