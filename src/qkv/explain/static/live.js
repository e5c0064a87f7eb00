// The live page (qkv.explain.live): a qkv run exported to ONNX, run by onnxruntime-web (the
// global `ort`, a classic script loaded before this module). One decoding step at a time through
// the exported key/value cache. LM: greedy or sampled with the sampler that
// qkv.explain.live.page_sampler replays in Python (keep the two in step). Translator: greedy, as
// qkv's greedy_decode; its tokenizer.json read by tokenizers.js.
import { Tokenizer } from "./tokenizers/tokenizers.min.mjs";

const live = {
  recipe: null, session: null, encoder: null, config: null, vocab: null, chars: null, tokenizer: null,
  busy: false, attention: null, tokens: [], source: [],
};
window.live = live;  // read by the tests

const $ = (id) => document.getElementById(id);

function say(text) { $("message").textContent = text; }

// mulberry32: a seedable uniform generator in [0, 1) (qkv.explain.live.mulberry32 in Python).
function mulberry32(seed) {
  let a = seed >>> 0;
  return function () {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t = ((t + Math.imul(t ^ (t >>> 7), t | 61)) ^ t) >>> 0;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// The next token from one row of logits and a draw u (page_sampler in Python): temperature 0
// is greedy; else softmax(logits / T) over the top-k (ties to the lower id), summed in id order.
function choose(logits, u, temperature, topK) {
  const n = logits.length;
  if (temperature === 0) return argmax(logits);
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => logits[b] - logits[a] || a - b);
  const kept = order.slice(0, topK || n).sort((a, b) => a - b);
  const top = logits[order[0]];
  const weights = kept.map((i) => Math.exp((logits[i] - top) / temperature));
  let total = 0;
  for (const w of weights) total += w;
  let running = 0;
  for (let j = 0; j < kept.length; j++) {
    running += weights[j] / total;
    if (running > u) return kept[j];
  }
  return kept[kept.length - 1];
}

// A character vocabulary (qkv's CharTokenizer, written as a WordLevel tokenizer.json).
function encode(text) {
  const ids = [];
  for (const ch of text) {
    if (!(ch in live.vocab)) throw new Error(`the character ${JSON.stringify(ch)} is not in the model's vocabulary`);
    ids.push(live.vocab[ch]);
  }
  return ids;
}

function emptyCache() {
  const c = live.config;
  const dims = [c.n_layers ?? c.n_decoder_layers, 1, c.n_heads, 0, c.d_model / c.n_heads];
  return { past_keys: new ort.Tensor("float32", new Float32Array(0), dims), past_values: new ort.Tensor("float32", new Float32Array(0), dims) };
}

function int64(ids) {
  return new ort.Tensor("int64", BigInt64Array.from(ids.map((i) => BigInt(i))), [1, ids.length]);
}

function lastRow(logits) {
  const [, t, v] = logits.dims;
  return Array.from(logits.data.subarray((t - 1) * v, t * v));
}

function readSettings() {
  const n = Number($("n").value), temperature = Number($("temperature").value);
  const topK = $("top-k").value === "" ? null : Number($("top-k").value);
  const seed = Number($("seed").value);
  if (!Number.isInteger(n) || n < 1) throw new Error("new tokens: a whole number, at least 1");
  if (!Number.isFinite(temperature) || temperature < 0) throw new Error("temperature: a number, at least 0 (0: greedy)");
  if (topK !== null && (!Number.isInteger(topK) || topK < 1)) throw new Error("top-k: a whole number, at least 1, or empty");
  if (!Number.isInteger(seed) || seed < 0) throw new Error("seed: a whole number, at least 0");
  return { n, temperature, topK, seed };
}

function argmax(row) {
  let best = 0;
  for (let i = 1; i < row.length; i++) if (row[i] > row[best]) best = i;
  return best;
}

// Greedy translation, as qkv's greedy_decode: the source + eos through the encoder, then one
// target token at a time until eos or the limit (the source's length + 50, at most max_len).
async function translate() {
  const c = live.config;
  const text = $("prompt").value.trim();
  if (text.length === 0) throw new Error("type a sentence first");
  const src = live.tokenizer.encode(text, { add_special_tokens: false }).ids.concat([c.eos_id]);
  if (src.length > c.max_len) throw new Error(`the sentence has ${src.length} tokens; the model reads at most ${c.max_len}`);
  const source = int64(src);
  const { memory } = await live.encoder.run({ src: source });
  const limit = Math.min(src.length + 50, c.max_len);
  let cache = emptyCache(), token = c.bos_id;
  const out = [];
  for (let step = 0; step < limit; step++) {
    const r = await live.session.run({ tgt: int64([token]), memory, src: source, ...cache });
    token = argmax(lastRow(r.logits));
    if (token === c.eos_id) break;
    out.push(token);
    cache = { past_keys: r.present_keys, past_values: r.present_values };
  }
  $("output").textContent = out.length ? live.tokenizer.decode(out) : "";
  live.source = src;
  live.tokens = [c.bos_id].concat(out);
  // one teacher-forced pass over what was written: the cross-attention of every layer
  const r = await live.session.run({ tgt: int64(live.tokens), memory, src: source, ...emptyCache() });
  live.attention = r.cross_attentions;
  drawAttention();
}

// The ViT: the canvas's pixels (its size is the model's) → pixel / 127.5 - 1 (qkv's
// to_model_input), one pass, the classes' probabilities and every layer's attention.
function pixels() {
  const c = live.config, size = c.image_size;
  const data = $("pixels").getContext("2d").getImageData(0, 0, size, size).data;
  const x = new Float32Array(c.channels * size * size);
  for (let i = 0; i < size * size; i++)
    for (let ch = 0; ch < c.channels; ch++) x[ch * size * size + i] = data[4 * i + (c.channels === 1 ? 0 : ch)] / 127.5 - 1;
  return new ort.Tensor("float32", x, [1, c.channels, size, size]);
}

async function classify() {
  const r = await live.session.run({ images: pixels() });
  const logits = Array.from(r.logits.data), top = Math.max(...logits);
  const e = logits.map((v) => Math.exp(v - top)), total = e.reduce((a, b) => a + b, 0);
  live.probs = e.map((v) => v / total);
  const order = live.probs.map((p, i) => i).sort((a, b) => live.probs[b] - live.probs[a]).slice(0, 5);
  $("output").textContent = order.map((i) => `${live.classes[i] ?? i}: ${(100 * live.probs[i]).toFixed(1)} %`).join("\n");
  live.attention = r.attentions;
  drawAttention();
}

async function openFile() {
  const file = $("file").files[0];
  if (!file) return;
  let bitmap;
  try {
    bitmap = await createImageBitmap(file);
  } catch {
    throw new Error(`${file.name} is not an image this browser can read`);
  }
  const size = live.config.image_size, ctx = $("pixels").getContext("2d");
  ctx.imageSmoothingEnabled = true;
  ctx.fillStyle = "#000";
  ctx.fillRect(0, 0, size, size);
  ctx.drawImage(bitmap, 0, 0, size, size);
  await classify();
}

function startDrawing() {
  const canvas = $("pixels"), ctx = canvas.getContext("2d"), size = live.config.image_size;
  ctx.fillStyle = "#000";
  ctx.fillRect(0, 0, size, size);
  let down = false;
  const at = (ev) => {
    const box = canvas.getBoundingClientRect();
    return [((ev.clientX - box.left) / box.width) * size, ((ev.clientY - box.top) / box.height) * size];
  };
  canvas.addEventListener("pointerdown", (ev) => { down = true; ctx.beginPath(); ctx.moveTo(...at(ev)); });
  canvas.addEventListener("pointermove", (ev) => {
    if (!down) return;
    ctx.strokeStyle = "#fff";
    ctx.lineWidth = Math.max(1, size / 10);
    ctx.lineCap = "round";
    ctx.lineTo(...at(ev));
    ctx.stroke();
  });
  canvas.addEventListener("pointerup", () => { down = false; generate(); });
  $("file").addEventListener("change", () => run(openFile));
  $("clear").addEventListener("click", () => { ctx.fillStyle = "#000"; ctx.fillRect(0, 0, size, size); });
}

// One request at a time: clear the message, run `work`, say what failed, mark the page done.
async function run(work) {
  if (live.busy) return;
  live.busy = true;
  say("");
  document.body.dataset.done = "0";
  $("generate").disabled = true;
  try {
    await work();
  } catch (err) {
    say(err.message);
  } finally {
    live.busy = false;
    $("generate").disabled = false;
    document.body.dataset.done = "1";
  }
}

function generate() {
  return run({ vit: classify, translation: translate }[live.recipe] ?? sample);
}

// The LM: the prompt, then one token at a time through the cache, drawn by `choose`.
async function sample() {
  const prompt = $("prompt").value;
  const settings = readSettings();
  if (prompt.length === 0) throw new Error("type a prompt first");
  const ids = encode(prompt);
  if (ids.length >= live.config.max_len)
    throw new Error(`the prompt has ${ids.length} tokens; the model reads at most ${live.config.max_len}, and needs room to write`);
  const draw = mulberry32(settings.seed);
  const out = [];
  let feed = ids, cache = emptyCache();
  for (let step = 0; step < settings.n; step++) {
    if (ids.length + out.length >= live.config.max_len) {
      say(`stopped at the model's context length (${live.config.max_len} tokens)`);
      break;
    }
    const r = await live.session.run({ tokens: int64(feed), ...cache });
    const next = choose(lastRow(r.logits), draw(), settings.temperature, settings.topK);
    out.push(next);
    cache = { past_keys: r.present_keys, past_values: r.present_values };
    feed = [next];
  }
  live.tokens = ids.concat(out);
  showText(prompt, out);
  await showAttention();
}

function showText(prompt, out) {
  const box = $("output");
  box.textContent = prompt;
  const span = document.createElement("span");
  span.className = "new";
  span.textContent = out.map((i) => live.chars[i]).join("");
  box.appendChild(span);
}

// One pass over the whole text (an empty cache): every layer's attention, (L, 1, H, T, T).
async function showAttention() {
  const r = await live.session.run({ tokens: int64(live.tokens), ...emptyCache() });
  live.attention = r.attentions;
  drawAttention();
}

// The chosen layer and head of (L, 1, H, T, K) weights: a row per query, a column per key.
function drawAttention() {
  const a = live.attention;
  if (!a) return;
  const [, , h, t, keys] = a.dims;
  const layer = Number($("layer").value), head = Number($("head").value);
  const canvas = $("attention"), ctx = canvas.getContext("2d");
  const cell = Math.max(1, Math.floor(canvas.width / Math.max(t, keys)));
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const base = (layer * h + head) * t * keys;
  for (let q = 0; q < t; q++) {
    for (let k = 0; k < keys; k++) {
      const w = a.data[base + q * keys + k];
      const shade = Math.round(255 * (1 - Math.min(1, w)));
      ctx.fillStyle = `rgb(${shade},${shade},255)`;
      ctx.fillRect(k * cell, q * cell, cell, cell);
    }
  }
  canvas.dataset.layer = String(layer);
  canvas.dataset.head = String(head);
}

function options(select, n, label) {
  select.innerHTML = "";
  for (let i = 0; i < n; i++) {
    const o = document.createElement("option");
    o.value = String(i);
    o.textContent = `${label} ${i + 1}`;
    select.appendChild(o);
  }
}

async function start() {
  try {
    const manifest = await (await fetch("model/onnx.json")).json();
    // a ViT reads pixels: its export has no tokenizer.json
    const tokenizer = manifest.files["tokenizer.json"] ? await (await fetch("model/tokenizer.json")).json() : null;
    live.recipe = manifest.recipe;
    live.config = manifest.config;
    ort.env.wasm.wasmPaths = new URL("ort/", location.href).href;
    ort.env.wasm.numThreads = 1;  // threads need cross-origin isolation, which a docs host may not give
    const graph = live.recipe === "vit" ? "model.onnx" : "decoder.onnx";
    live.session = await ort.InferenceSession.create(`model/${graph}`);
    const c = live.config, layers = c.n_layers ?? c.n_decoder_layers;
    let mb = manifest.files[graph].bytes / 1e6;
    if (live.recipe === "vit") {
      live.classes = manifest.classes ?? [];
      $("text-input").hidden = true;
      $("image-input").hidden = false;
      $("pixels").width = $("pixels").height = c.image_size;
      for (const id of ["temperature", "top-k", "seed", "n"]) $(id).disabled = true;
      $("generate").textContent = "Classify";
      $("attention-kind").textContent = "rows: the token that attends (0: the class token); columns: the tokens it reads (1 ...: the patches, row by row)";
      startDrawing();
    } else if (live.recipe === "translation") {
      live.encoder = await ort.InferenceSession.create("model/encoder.onnx");
      live.tokenizer = new Tokenizer(tokenizer, { clean_up_tokenization_spaces: false });
      mb += manifest.files["encoder.onnx"].bytes / 1e6;
      $("prompt").value = "Ein Mann fährt mit dem Fahrrad.";
      for (const id of ["temperature", "top-k", "seed", "n"]) $(id).disabled = true;  // greedy, as qkv translate --beam 1
      $("attention-kind").textContent = "cross-attention: rows the English tokens written, columns the source tokens";
    } else {
      live.vocab = tokenizer.model.vocab;
      live.chars = [];
      for (const [ch, id] of Object.entries(live.vocab)) live.chars[id] = ch;
    }
    options($("layer"), layers, "layer");
    options($("head"), c.n_heads, "head");
    $("about").textContent = `the ${manifest.recipe} recipe's run: ${layers} layers, ${c.n_heads} heads, ` +
      `d_model ${c.d_model}, context ${c.max_len} tokens; ${mb.toFixed(1)} MB of ONNX graphs`;
    $("generate").disabled = false;
    document.body.dataset.ready = "1";
  } catch (err) {
    say(`the model could not be loaded: ${err.message}`);
  }
}

$("generate").addEventListener("click", generate);
$("layer").addEventListener("change", drawAttention);
$("head").addEventListener("change", drawAttention);
start();
