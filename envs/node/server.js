// denv's node env: an echo env in plain Node.js (no npm packages) speaking enough of
// OpenEnv's API for its clients (GenericEnvClient, denv's DenvProvider):
//   GET  /health             200 {"status": "healthy"}
//   POST /reset              {"seed"?, "episode_id"?} -> {"observation", "reward", "done"}
//   POST /step               {"action": {"message": "hi"}} -> the same shape
//   GET  /state              {"episode_id", "step_count", "last_message"}
//   GET  /ws (WebSocket)     OpenEnv's session frames: reset, step, state, close
// Answers mirror denv's echo env (envs/echo): a step echoes its message with its length,
// reward 0.1 * length, and its step number in metadata.
//
// The episode lives in one file under /work ($STATE_PATH), read on every request and
// written (atomically) on every reset and step, never in memory: a fork by snapshot of
// /work, whose children are fresh processes, continues the episode. Every session shares
// that one episode, as the echo env's sessions share /work/.denv/state.json.
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const http = require("http");
const path = require("path");

const PORT = Number(process.env.PORT || 8000);
const STATE_PATH = process.env.STATE_PATH || "/work/node-env/episode.json";
// RFC 6455's constant that a server appends to the client's key to accept an upgrade.
const WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const MAX_BODY = 1 << 20;

function newEpisode(episodeId) {
  return { episode_id: episodeId || crypto.randomUUID(), step_count: 0, last_message: null };
}

function load() {
  try {
    return JSON.parse(fs.readFileSync(STATE_PATH, "utf8"));
  } catch (err) {
    if (err.code === "ENOENT") return newEpisode();
    throw err;
  }
}

// Temporary file, fsync, rename: a snapshot taken at any instant holds a whole episode.
function save(episode) {
  fs.mkdirSync(path.dirname(STATE_PATH), { recursive: true });
  const tmp = `${STATE_PATH}.${process.pid}.tmp`;
  const fd = fs.openSync(tmp, "w");
  try {
    fs.writeSync(fd, JSON.stringify(episode));
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, STATE_PATH);
}

function reset(data) {
  const episode = newEpisode(data && data.episode_id);
  save(episode);
  const metadata = { status: "ready", message: "Node environment ready!" };
  return { observation: { metadata }, reward: 0.0, done: false, metadata };
}

function step(action) {
  if (!action || typeof action.message !== "string") {
    throw new Error('a step needs {"message": "..."}');
  }
  const episode = load();
  episode.step_count += 1;
  episode.last_message = action.message;
  save(episode);
  const metadata = { step: episode.step_count };
  const observation = {
    echoed_message: action.message,
    message_length: action.message.length,
    metadata,
  };
  return { observation, reward: action.message.length * 0.1, done: false, metadata };
}

// ---- HTTP ----

function send(res, status, body) {
  const data = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { "content-type": "application/json", "content-length": data.length });
  res.end(data);
}

function readJson(req, done) {
  const chunks = [];
  let size = 0;
  req.on("data", (chunk) => {
    size += chunk.length;
    if (size <= MAX_BODY) chunks.push(chunk);
  });
  req.on("end", () => {
    if (size > MAX_BODY) return done(new Error("request body too large"));
    const text = Buffer.concat(chunks).toString("utf8");
    try {
      done(null, text ? JSON.parse(text) : {});
    } catch (err) {
      done(err);
    }
  });
}

function route(req, res) {
  const url = new URL(req.url, "http://env");
  const call = `${req.method} ${url.pathname}`;
  if (call === "GET /health") return send(res, 200, { status: "healthy" });
  if (call === "GET /state") return send(res, 200, load());
  if (call !== "POST /reset" && call !== "POST /step") {
    return send(res, 404, { detail: "Not Found" });
  }
  readJson(req, (err, body) => {
    if (err) return send(res, 422, { detail: `invalid JSON body: ${err.message}` });
    try {
      send(res, 200, call === "POST /reset" ? reset(body) : step(body.action));
    } catch (stepErr) {
      send(res, 422, { detail: stepErr.message });
    }
  });
}

// ---- WebSocket (RFC 6455: text frames, ping/pong, close; no extensions) ----

function frame(opcode, payload) {
  const n = payload.length;
  let head;
  if (n < 126) {
    head = Buffer.from([0, n]);
  } else if (n < 65536) {
    head = Buffer.alloc(4);
    head.writeUInt16BE(n, 2);
    head[1] = 126;
  } else {
    head = Buffer.alloc(10);
    head.writeBigUInt64BE(BigInt(n), 2);
    head[1] = 127;
  }
  head[0] = 0x80 | opcode;
  return Buffer.concat([head, payload]);
}

// One complete frame at the start of buf, or null when more bytes are needed.
function parseFrame(buf) {
  if (buf.length < 2) return null;
  const fin = (buf[0] & 0x80) !== 0;
  const opcode = buf[0] & 0x0f;
  const masked = (buf[1] & 0x80) !== 0;
  let len = buf[1] & 0x7f;
  let at = 2;
  if (len === 126) {
    if (buf.length < 4) return null;
    len = buf.readUInt16BE(2);
    at = 4;
  } else if (len === 127) {
    if (buf.length < 10) return null;
    len = Number(buf.readBigUInt64BE(2));
    at = 10;
  }
  const maskAt = at;
  if (masked) at += 4;
  if (buf.length < at + len) return null;
  const payload = Buffer.from(buf.subarray(at, at + len));
  if (masked) {
    for (let i = 0; i < len; i++) payload[i] ^= buf[maskAt + (i % 4)];
  }
  return { fin, opcode, payload, size: at + len };
}

function answer(message) {
  switch (message.type) {
    case "reset":
      return { type: "observation", data: reset(message.data || {}) };
    case "step":
      return { type: "observation", data: step(message.data) };
    case "state":
      return { type: "state", data: load() };
    default:
      return {
        type: "error",
        data: { message: `Unknown message type: ${message.type}`, code: "UNKNOWN_TYPE" },
      };
  }
}

function upgrade(req, socket) {
  const url = new URL(req.url, "http://env");
  const key = req.headers["sec-websocket-key"];
  if (url.pathname !== "/ws" || !key) {
    socket.end("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
    return;
  }
  const accept = crypto.createHash("sha1").update(key + WS_GUID).digest("base64");
  socket.write(
    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
      `Sec-WebSocket-Accept: ${accept}\r\n\r\n`,
  );
  const sendJson = (body) => socket.write(frame(0x1, Buffer.from(JSON.stringify(body))));
  const close = () => {
    if (!socket.destroyed) socket.end(frame(0x8, Buffer.from([0x03, 0xe8])));  // 1000
  };
  // Attaching to an existing session (OpenEnv's ?session_id=): this env has none by id,
  // so it refuses naming the id and opens nothing, as OpenEnv does (denv's probe).
  const wanted = url.searchParams.get("session_id");
  if (wanted) {
    sendJson({ type: "error", data: { message: `Unknown session_id: ${wanted}`, code: "SESSION_ERROR" } });
    close();
    return;
  }
  let pending = Buffer.alloc(0);
  let parts = [];
  socket.on("data", (chunk) => {
    pending = Buffer.concat([pending, chunk]);
    for (let f = parseFrame(pending); f; f = parseFrame(pending)) {
      pending = pending.subarray(f.size);
      if (f.opcode === 0x8) return close();
      if (f.opcode === 0x9) {
        socket.write(frame(0xa, f.payload));
        continue;
      }
      if (f.opcode === 0xa) continue;
      parts.push(f.payload);
      if (!f.fin) continue;
      const text = Buffer.concat(parts).toString("utf8");
      parts = [];
      let message;
      try {
        message = JSON.parse(text);
      } catch (err) {
        sendJson({ type: "error", data: { message: `Invalid JSON: ${err.message}`, code: "INVALID_JSON" } });
        continue;
      }
      if (message.type === "close") return close();
      try {
        sendJson(answer(message));
      } catch (err) {
        sendJson({ type: "error", data: { message: err.message, code: "EXECUTION_ERROR" } });
      }
    }
  });
  socket.on("error", () => socket.destroy());
}

const server = http.createServer(route);
server.on("upgrade", upgrade);
server.listen(PORT, "0.0.0.0", () => {
  console.log(`node env on :${PORT}, episode in ${STATE_PATH}`);
});
// docker stop sends SIGTERM; node as pid 1 has no default handler for it. Every write is
// already on disk, so there is nothing to finish.
process.on("SIGTERM", () => process.exit(0));
