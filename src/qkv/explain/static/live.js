// The live page (qkv.explain.live): a qkv run exported to ONNX, run by onnxruntime-web (the
// global `ort`, a classic script loaded before this module). One decoding step at a time through
// the exported key/value cache. LM: greedy or sampled with the sampler that
// qkv.explain.live.page_sampler replays in Python (keep the two in step). Translator and
// captioner: greedy, as qkv's greedy_decode; their tokenizer.json read by tokenizers.js. ViT: a
// drawn or opened image. An input that fails clears the last input's result: what the page shows
// always answers the input on screen.
import { Tokenizer } from "./tokenizers/tokenizers.min.mjs";

const live = {
  folder: null, layers: 0, recipe: null, session: null, encoder: null, config: null, vocab: null, pieces: [], tokenizer: null,
  busy: false, again: null, attention: null, tokens: [], source: [], word: 0, known: null,
};
window.live = live;  // read by the tests

const $ = (id) => document.getElementById(id);

function say(text) { $("message").textContent = text; }

// A note on a result that stands (the translator's unknown characters); "" hides it.
function warn(text) {
  $("warning").textContent = text;
  $("warning").hidden = text === "";
}

// The last input's result (its text, classes or caption, and their attention), cleared when a
// new input fails: the page never shows an answer beside an input it was not computed from.
function clearResult() {
  $("output").textContent = "";
  $("words").innerHTML = "";
  $("look-row").hidden = true;
  Object.assign(live, { attention: null, tokens: [], source: [], probs: null, pixels: null });
  const canvas = $("attention");
  canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
}

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
  const dims = [live.layers, 1, c.n_heads, 0, c.d_model / c.n_heads];
  return { past_keys: new ort.Tensor("float32", new Float32Array(0), dims), past_values: new ort.Tensor("float32", new Float32Array(0), dims) };
}

function int64(ids) {
  return new ort.Tensor("int64", BigInt64Array.from(ids.map((i) => BigInt(i))), [1, ids.length]);
}

// The last position's logits: a view, not a copy (read once per decoding step).
function lastRow(logits) {
  const [, t, v] = logits.dims;
  return logits.data.subarray((t - 1) * v, t * v);
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

// Greedy decoding through the exported cache, as qkv's greedy_decode: from bos, the most probable
// token until eos or `limit` tokens; then one teacher-forced pass over what was written for every
// layer's cross-attention (bos and at most max_len - 1 of the tokens: the positions the model
// has; the last of max_len written tokens is never read). `inputs`: the encoder's memory (and the
// translator's src).
async function greedy(inputs, limit) {
  const c = live.config;
  let cache = emptyCache(), token = c.bos_id;
  const out = [];
  for (let step = 0; step < limit; step++) {
    const r = await live.session.run({ tgt: int64([token]), ...inputs, ...cache });
    token = argmax(lastRow(r.logits));
    if (token === c.eos_id) break;
    out.push(token);
    cache = { past_keys: r.present_keys, past_values: r.present_values };
  }
  live.tokens = [c.bos_id].concat(out.slice(0, c.max_len - 1));
  const r = await live.session.run({ tgt: int64(live.tokens), ...inputs, ...emptyCache() });
  live.attention = r.cross_attentions;
  return out;
}

// The translator: the source + eos through the encoder; the limit is the source's length + 50,
// at most max_len (greedy_decode's).
async function translate() {
  const c = live.config;
  const text = $("prompt").value.trim();
  if (text.length === 0) throw new Error("type a sentence first");
  const src = live.tokenizer.encode(text, { add_special_tokens: false }).ids.concat([c.eos_id]);
  if (src.length > c.max_len) throw new Error(`the sentence has ${src.length} tokens; the model reads at most ${c.max_len}`);
  const source = int64(src);
  const { memory } = await live.encoder.run({ src: source });
  const out = await greedy({ memory, src: source }, Math.min(src.length + 50, c.max_len));
  $("output").textContent = out.length ? live.tokenizer.decode(out) : "";
  live.source = src;
  const unknown = unknownCharacters(text);
  if (unknown.length)
    warn(`unknown characters (not in the model's vocabulary, read as <unk>): ${unknown.map((ch) => JSON.stringify(ch)).join(", ")}`);
  drawAttention();
}

// The characters of `text` the vocabulary lacks, each once, in order: the subword tokenizer reads
// each as <unk> (no byte fallback), and the model translates around a piece it knows nothing of.
// A character is unknown when, after the tokenizer's normalizer (NFKC), one of its characters is
// not a piece of the vocabulary (BPE keeps every character it was trained on as a piece); a
// space is the pre-tokenizer's word boundary (▁), a tab or a newline is a character like others.
function unknownCharacters(text) {
  const found = [], norm = live.tokenizer.normalizer;
  for (const ch of text) {
    if (found.includes(ch)) continue;
    const chars = Array.from(norm ? norm(ch) : ch).filter((c) => c !== " ");
    if (chars.some((c) => !live.known.has(c))) found.push(ch);
  }
  return found;
}

// The captioner: the composed scene through the encoder; bos + the caption fit max_len.
async function caption() {
  if (scene.cells.every((g) => g === null)) throw new Error("put a garment in the grid first");
  const images = pixels("scene");
  live.pixels = Array.from(images.data);
  const { memory } = await live.encoder.run({ images });
  const out = await greedy({ memory }, live.config.max_len - 1);
  $("output").textContent = out.length ? live.tokenizer.decode(out) : "";
  const words = $("words");
  words.innerHTML = "";
  out.forEach((id, j) => {
    const b = document.createElement("button");
    b.textContent = live.tokenizer.decode([id]) || "·";
    b.addEventListener("click", () => { live.word = j; drawAttention(); });
    words.appendChild(b);
  });
  live.word = 0;
  $("look-row").hidden = out.length === 0;
  drawAttention();
}

// The scene being composed (qkv.data.scenes: 2 × 2 cells of 28 × 28 garments on black): each
// cell null or [label, index into the sheet's row]; `picked`: the cell the next garment goes to.
const scene = { cells: [null, null, null, null], picked: 0, sheet: null, cell: 0 };

async function startComposer() {
  const meta = await (await fetch(`${live.folder}/garments.json`)).json();
  const img = new Image();
  img.src = `${live.folder}/garments.png`;
  await img.decode();
  const sheet = document.createElement("canvas");
  sheet.width = img.width;
  sheet.height = img.height;
  sheet.getContext("2d").drawImage(img, 0, 0);
  Object.assign(scene, { sheet, cell: meta.cell });
  $("scene").width = $("scene").height = live.config.image_size;
  for (let i = 0; i < 4; i++) {
    const b = document.createElement("button");
    Object.assign(b.style, { left: `${(i % 2) * 112}px`, top: `${Math.floor(i / 2) * 112}px` });
    b.dataset.cell = String(i);
    b.title = `cell ${i + 1}`;
    b.addEventListener("click", () => pickCell(i));
    $("grid").appendChild(b);
  }
  meta.nouns.forEach((noun, label) => {
    const row = document.createElement("div");
    const name = document.createElement("span");
    name.textContent = noun;
    row.appendChild(name);
    for (let k = 0; k < meta.per_class; k++) {
      const g = document.createElement("canvas");
      g.width = g.height = meta.cell;
      Object.assign(g.dataset, { label: String(label), index: String(k) });
      g.title = noun;
      g.getContext("2d").drawImage(sheet, k * meta.cell, label * meta.cell, meta.cell, meta.cell, 0, 0, meta.cell, meta.cell);
      g.addEventListener("click", () => place([label, k]));
      row.appendChild(g);
    }
    $("palette").appendChild(row);
  });
  $("random").addEventListener("click", () => {
    const n = meta.nouns.length, cells = scene.cells.map(() => Math.random() < 0.6);
    if (!cells.some(Boolean)) cells[Math.floor(Math.random() * 4)] = true;
    scene.cells = cells.map((on) => (on ? [Math.floor(Math.random() * n), Math.floor(Math.random() * meta.per_class)] : null));
    paintScene();
    generate();
  });
  $("empty").addEventListener("click", () => {
    scene.cells = [null, null, null, null];
    paintScene();
    clearResult();  // the caption and its attention were the last scene's
  });
  pickCell(0);
  paintScene();
}

function pickCell(i) {
  scene.picked = i;
  for (const b of $("grid").querySelectorAll("button")) b.classList.toggle("picked", Number(b.dataset.cell) === i);
}

// The picked cell takes the garment (or is emptied, if it holds that one); the next cell is
// picked and the scene captioned.
function place(garment) {
  const now = scene.cells[scene.picked];
  scene.cells[scene.picked] = now && now[0] === garment[0] && now[1] === garment[1] ? null : garment;
  pickCell((scene.picked + 1) % 4);
  paintScene();
  if (scene.cells.some((g) => g !== null)) generate();
}

function paintScene() {
  const ctx = $("scene").getContext("2d"), size = live.config.image_size, half = size / 2, cell = scene.cell;
  ctx.fillStyle = "#000";
  ctx.fillRect(0, 0, size, size);
  scene.cells.forEach((g, i) => {
    if (g) ctx.drawImage(scene.sheet, g[1] * cell, g[0] * cell, cell, cell, (i % 2) * half, Math.floor(i / 2) * half, half, half);
  });
}

// A canvas's pixels (its size is the model's) → pixel / 127.5 - 1 (qkv's to_model_input).
function pixels(canvas) {
  const c = live.config, size = c.image_size;
  const data = $(canvas).getContext("2d").getImageData(0, 0, size, size).data;
  const x = new Float32Array(c.channels * size * size);
  for (let i = 0; i < size * size; i++)
    for (let ch = 0; ch < c.channels; ch++) x[ch * size * size + i] = data[4 * i + (c.channels === 1 ? 0 : ch)] / 127.5 - 1;
  return new ort.Tensor("float32", x, [1, c.channels, size, size]);
}

// The ViT: one pass over the drawn image, the classes' probabilities and every layer's attention.
async function classify() {
  const r = await live.session.run({ images: pixels("pixels") });
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

// One request at a time: clear the message, run `work`, say what failed (and clear the last
// input's result), mark the page done. A request made meanwhile (a stroke, a garment placed)
// runs next, so what is shown is the input's.
async function run(work) {
  if (live.busy) {
    live.again = work;
    return;
  }
  live.busy = true;
  say("");
  warn("");
  document.body.dataset.done = "0";
  $("generate").disabled = true;
  try {
    await work();
    while (live.again) {
      const next = live.again;
      live.again = null;
      await next();
    }
  } catch (err) {
    clearResult();
    say(err.message);
  } finally {
    live.busy = false;
    live.again = null;
    $("generate").disabled = false;
    document.body.dataset.done = "1";
  }
}

function generate() {
  return run({ vit: classify, translation: translate, caption }[live.recipe] ?? sample);
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
  span.textContent = out.map((i) => live.pieces[i]).join("");
  box.appendChild(span);
}

// One pass over the whole text (an empty cache): every layer's attention, (L, 1, H, T, T).
async function showAttention() {
  const r = await live.session.run({ tokens: int64(live.tokens), ...emptyCache() });
  live.attention = r.attentions;
  drawAttention();
}

// The chosen layer and head of (L, 1, H, T, K) weights: a row per query, a column per key.
// Labelled while the cells stay readable (up to MAX_LABELLED tokens a side).
const MAX_LABELLED = 48, MARGIN = 64;

function drawAttention() {
  const a = live.attention;
  if (!a) return;
  const [, , h, t, keys] = a.dims;
  const layer = Number($("layer").value), head = Number($("head").value);
  const canvas = $("attention"), ctx = canvas.getContext("2d");
  const labels = Math.max(t, keys) <= MAX_LABELLED ? axisLabels(keys) : null, margin = labels ? MARGIN : 0;
  const cell = Math.max(1, Math.floor((canvas.width - margin) / Math.max(t, keys)));
  canvas.height = Math.min(canvas.width, margin + t * cell);  // the rows' height (clears the canvas)
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const base = (layer * h + head) * t * keys;
  for (let q = 0; q < t; q++) {
    for (let k = 0; k < keys; k++) {
      const w = a.data[base + q * keys + k];
      const shade = Math.round(255 * (1 - Math.min(1, w)));
      ctx.fillStyle = `rgb(${shade},${shade},255)`;
      ctx.fillRect(margin + k * cell, margin + q * cell, cell, cell);
    }
  }
  if (labels) drawLabels(ctx, labels, cell);
  canvas.dataset.layer = String(layer);
  canvas.dataset.head = String(head);
  if (live.recipe === "caption") drawLook(a.data.subarray(base + live.word * keys, base + (live.word + 1) * keys));
}

// The heatmap's axes: [rows, columns], the tokens that attend and what they read.
function axisLabels(keys) {
  const show = (ids) => ids.map((i) => (live.pieces[i] ?? String(i)).replace(/\n/g, "⏎").replace(/ /g, "␣"));
  const patches = (n) => Array.from({ length: n }, (_, k) => `patch ${k + 1}`);
  if (live.recipe === "vit") return [["class", ...patches(keys - 1)], ["class", ...patches(keys - 1)]];
  if (live.recipe === "caption") return [show(live.tokens), patches(keys)];
  return [show(live.tokens), show(live.recipe === "translation" ? live.source : live.tokens)];
}

function drawLabels(ctx, [rows, columns], cell) {
  ctx.fillStyle = "#1d2330";
  ctx.font = `${Math.min(11, cell)}px ui-monospace, monospace`;
  ctx.textBaseline = "middle";
  const fit = (text) => (text.length > 9 ? text.slice(0, 8) + "…" : text);
  ctx.textAlign = "right";
  rows.forEach((text, q) => ctx.fillText(fit(text), MARGIN - 4, MARGIN + (q + 0.5) * cell));
  ctx.save();
  ctx.rotate(-Math.PI / 2);
  ctx.textAlign = "left";
  columns.forEach((text, k) => ctx.fillText(fit(text), -MARGIN + 4, MARGIN + (k + 0.5) * cell));
  ctx.restore();
}

// The captioner's view (qkv explain's word maps): the scene, and over it one written token's
// cross-attention on the patches (reading order, a square grid), darkest where it looked most.
function drawLook(row) {
  const canvas = $("look"), ctx = canvas.getContext("2d"), side = canvas.width;
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage($("scene"), 0, 0, side, side);
  const g = Math.round(Math.sqrt(row.length)), cell = side / g, top = Math.max(...row);
  for (let k = 0; k < row.length; k++) {
    ctx.fillStyle = `rgba(255, 120, 0, ${(0.75 * row[k]) / top})`;
    ctx.fillRect((k % g) * cell, Math.floor(k / g) * cell, cell, cell);
  }
  for (const [j, b] of Array.from($("words").children).entries()) b.classList.toggle("picked", j === live.word);
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

// Sampling settings are the LM's: the other pages decode greedily or classify.
function hideSampling() {
  for (const id of ["temperature", "top-k", "seed", "n"]) $(id).closest("label").hidden = true;
}

// The model's folder: model/ beside the page (what qkv explain --live writes), or ?model=NAME, a
// folder beside the page (a docs site serves several models with one page and one runtime).
function modelFolder() {
  const name = new URLSearchParams(location.search).get("model");
  if (name === null) return "model";
  if (!/^[A-Za-z0-9_-]+$/.test(name)) throw new Error(`no model named ${JSON.stringify(name)} here`);
  return name;
}

// A side of a translator's languages (the manifest's "languages", from the run's settings):
// "German (de)", a column's name, or null where the export does not say.
function languageName(side) {
  if (!side) return null;
  return side.code && side.code !== side.name ? `${side.name} (${side.code})` : side.name;
}

// The translator's fields and button say what it translates (its languages, where the manifest
// gives them); the example sentence is German, the language of the recipe's default run.
function setUpTranslator(languages) {
  const from = languageName(languages && languages.source), to = languageName(languages && languages.target);
  $("prompt-label").textContent = from ? `Source: ${from}` : "Source sentence";
  $("output-label").textContent = to ? `Translation: ${to}` : "Translation";
  $("output-label").hidden = false;
  $("generate").textContent = "Translate";
  const german = !languages || (languages.source && languages.source.code === "de");
  $("prompt").value = german ? "Ein Mann fährt mit dem Fahrrad." : "";
  const written = languages && languages.target ? `${languages.target.name} tokens` : "tokens";
  $("attention-kind").textContent = `cross-attention: rows the ${written} written, columns the source tokens`;
  return from && to ? `${from} → ${to}` : null;
}

// The page's header: the run's shape and what one input is (a ViT: the tokens of the image,
// patches and the class token; not its position table's size).
function describe(recipe, c, languages, mb) {
  const shape = `${live.layers} layers, ${c.n_heads} heads, d_model ${c.d_model}`;
  const patches = c.image_size && c.patch_size ? (c.image_size / c.patch_size) ** 2 : 0;
  const input = {
    vit: `an image of ${c.image_size} × ${c.image_size} pixels is ${patches} patches of ${c.patch_size} × ${c.patch_size} + the class token: ${patches + 1} tokens`,
    caption: `a scene is ${patches} patches of ${c.patch_size} × ${c.patch_size}; captions of at most ${c.max_len} tokens`,
    translation: `sentences of at most ${c.max_len} tokens`,
  }[recipe] ?? `context ${c.max_len} tokens`;
  const what = languages ? ` (${languages})` : "";
  return `the ${recipe} recipe's run${what}: ${shape}; ${input}; ${mb.toFixed(1)} MB of ONNX graphs`;
}

function setUpViT(manifest) {
  live.classes = manifest.classes ?? [];
  $("text-input").hidden = true;
  $("image-input").hidden = false;
  $("pixels").width = $("pixels").height = live.config.image_size;
  hideSampling();
  $("generate").textContent = "Classify";
  $("attention-kind").textContent = "rows: the token that attends (0: the class token); columns: the tokens it reads (1 ...: the patches, row by row)";
  startDrawing();
}

// The encoder-decoders (translator, captioner): their encoder graph and subword tokenizer.
// Returns the languages' line of the header (null for a captioner) and the encoder's MB.
async function setUpEncoderDecoder(manifest, tokenizer) {
  live.encoder = await ort.InferenceSession.create(`${live.folder}/encoder.onnx`);
  live.tokenizer = new Tokenizer(tokenizer, { clean_up_tokenization_spaces: false });
  live.known = new Set(Object.keys(tokenizer.model.vocab));
  hideSampling();  // greedy, as qkv translate/caption --beam 1
  let languages = null;
  if (live.recipe === "translation") {
    languages = setUpTranslator(manifest.languages);
  } else {
    $("text-input").hidden = true;
    $("scene-input").hidden = false;
    $("generate").textContent = "Caption";
    $("attention-kind").textContent = "cross-attention: rows the caption's tokens, columns the patches (row by row)";
    await startComposer();
  }
  return [languages, manifest.files["encoder.onnx"].bytes / 1e6];
}

async function start() {
  try {
    live.folder = modelFolder();
    const manifest = await (await fetch(`${live.folder}/onnx.json`)).json();
    // a ViT reads pixels: its export has no tokenizer.json
    const tokenizer = manifest.files["tokenizer.json"] ? await (await fetch(`${live.folder}/tokenizer.json`)).json() : null;
    live.recipe = manifest.recipe;
    live.config = manifest.config;
    live.pieces = [];  // id → its piece (a character, a subword): the heatmap's labels
    if (tokenizer) for (const [piece, id] of Object.entries(tokenizer.model.vocab)) live.pieces[id] = piece;
    ort.env.wasm.wasmPaths = new URL("ort/", location.href).href;
    ort.env.wasm.numThreads = 1;  // threads need cross-origin isolation, which a docs host may not give
    const graph = live.recipe === "vit" ? "model.onnx" : "decoder.onnx";
    live.session = await ort.InferenceSession.create(`${live.folder}/${graph}`);
    const c = live.config;
    live.layers = c.n_layers ?? c.n_decoder_layers;  // an encoder-decoder's: the decoder's (its cache)
    let mb = manifest.files[graph].bytes / 1e6, languages = null;
    if (live.recipe === "vit") {
      setUpViT(manifest);
    } else if (live.recipe === "translation" || live.recipe === "caption") {
      const [named, encoderMB] = await setUpEncoderDecoder(manifest, tokenizer);
      languages = named;
      mb += encoderMB;
    } else {
      live.vocab = tokenizer.model.vocab;
    }
    options($("layer"), live.layers, "layer");
    options($("head"), c.n_heads, "head");
    $("about").textContent = describe(live.recipe, c, languages, mb);
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
