// qkv explain — the page's only script. Vanilla JS with no dependencies, so the page works
// offline and is served as three static files. Every string that comes from the model
// (tokens, output text, class labels) is inserted with textContent, never as HTML.
//
// Two modes. Served (qkv explain --serve): the page asks the local server (/api/...).
// Standalone (qkv.show, qkv explain --html): one file with this script inline and the
// model's answers in <script id="qkv-data">; nothing is fetched, and the Eq. 1 step-through is
// recomputed here from the saved Q, K, V and mask. Interventions (ablate a head, zero a neuron,
// patch from another input) ask /api/intervene; a standalone page holds every head's ablation,
// precomputed when the model is small enough, and nothing else.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG_NS = "http://www.w3.org/2000/svg";
const MAX_TABLE = 64;  // step tables beyond this many rows/columns would freeze the page

const state = {
  info: null,   // GET /api/info
  data: null,   // last successful POST /api/explain
  body: null,   // the request that produced `data`; /api/steps must describe the same run
  kind: null, layer: 0, head: 0,
  runSeq: 0, stepSeq: 0, stepTimer: null,
  heat: null,   // geometry of the drawn heatmap, for the hover read-out
  stretch: false,  // colour scale 0..head's max instead of 0..1 (diffuse heads look blank otherwise)
  image: null,    // ViT runs: the chosen input, {file: File} or {example: test-set index}
  picture: null,  // ViT runs: the model's input of the last run, a loaded <img>
  standalone: null,  // standalone page: the embedded data (info, explanation, body, steps, notes)
  decoded: {},       // standalone page: Q, K, V of a "kind/layer", decoded once
  step: null,        // diffusion LMs: the denoising step whose input the attention is on (null: the last)
  block: null, blockToken: 0,  // output.block of the last run, and the token followed
  ivSeq: 0,     // a newer intervention makes older answers stale
};

// ViT runs take an image instead of text (GET /api/info says "input": "image").
const isImage = () => Boolean(state.info && state.info.input === "image");
// Captioners take an image too; they have no class token, and draw each word's attention instead.
const isCaption = () => Boolean(state.info && state.info.family === "caption");
const isViT = () => isImage() && !isCaption();

// ---------- small helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);  // strings become text nodes: safe for data
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// Whitespace-only tokens would be invisible; the server already maps most, this is a fallback.
function showToken(t) {
  if (t === "") return "∅";
  if (/^\s+$/.test(t)) return t.replace(/ /g, "␣").replace(/\n/g, "⏎").replace(/\t/g, "⇥");
  return t;
}

function shorten(t, n = 16) { return t.length > n ? t.slice(0, n - 1) + "…" : t; }

// Fixed decimals with a real minus sign, and no "−0.00".
function fmt(x, digits = 2) {
  if (x === null || x === undefined) return "−∞";
  const s = Math.abs(x).toFixed(digits);
  return x < 0 && Number(s) !== 0 ? "−" + s : s;
}

// Sequential white → dark blue (ColorBrewer "Blues" stops) for weights in [0, 1].
const BLUES = [[255, 255, 255], [222, 235, 247], [158, 202, 225], [66, 146, 198], [8, 48, 107]];
function blues(t) {
  t = Math.min(1, Math.max(0, t || 0)) * (BLUES.length - 1);
  const i = Math.min(Math.floor(t), BLUES.length - 2), f = t - i;
  return BLUES[i].map((c, j) => Math.round(c + (BLUES[i + 1][j] - c) * f));
}
const rgb = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;

// The top of the colour scale for one head's weights: 1, or their maximum when stretched.
function scaleMax(W) {
  if (!state.stretch) return 1;
  let m = 0;
  for (const row of W) for (const v of row) m = Math.max(m, v);
  return m > 0 ? m : 1;
}

// Signed values (Q, K, V, scores): blue for positive, orange for negative, pale so the
// numbers stay readable; t in [-1, 1].
function diverging(t) {
  if (t >= 0) return blues(t * 0.6);
  const a = Math.min(1, -t) * 0.6;
  return [255, 255, 255].map((c, j) => Math.round(c + ([230, 120, 30][j] - c) * a));
}

// ---------- API

async function api(path, body) {
  return request(path, body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
}

// ViT runs: POST the chosen image file's bytes as they are (or nothing, with ?example=K).
function imageApi(path, image, params = {}) {
  const query = new URLSearchParams(params);
  if (image.example !== undefined) query.set("example", String(image.example));
  return request(`${path}?${query}`, image.file
    ? { method: "POST", headers: { "Content-Type": image.file.type || "application/octet-stream" }, body: image.file }
    : { method: "POST" });
}

async function request(path, init) {
  const res = await fetch(path, init);
  const text = await res.text();
  let payload = null;
  try { payload = JSON.parse(text); } catch (_) { /* not JSON: reported below */ }
  if (!res.ok) throw new Error(errorMessage(res, payload, text));
  if (payload === null) throw new Error(`${path}: the server's answer is not JSON`);
  return payload;
}

// FastAPI sends {"detail": "message"} for our own errors and {"detail": [{loc, msg}, ...]}
// for request validation; show both as one readable line.
function errorMessage(res, payload, text) {
  const d = payload && payload.detail;
  if (typeof d === "string") return d;
  if (Array.isArray(d)) {
    return d.map((e) => {
      if (typeof e === "string") return e;
      const loc = Array.isArray(e.loc) ? e.loc.filter((p) => p !== "body").join(".") : "";
      return (loc ? loc + ": " : "") + (e.msg || JSON.stringify(e));
    }).join("; ");
  }
  return `HTTP ${res.status} ${res.statusText}${text ? ": " + text.slice(0, 200) : ""}`;
}

function showError(msg) { const box = $("error"); box.textContent = msg; box.hidden = false; }
function hideError() { const box = $("error"); box.textContent = ""; box.hidden = true; }

// ---------- set-up

async function init() {
  $("run").addEventListener("click", () => { state.step = null; run(); });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); state.step = null; run(); }
  });
  $("input").addEventListener("input", updateCount);
  $("kind").addEventListener("change", () => { state.kind = $("kind").value; selectKind(); });
  $("layer").addEventListener("change", () => select(+$("layer").value, state.head));
  $("head").addEventListener("change", () => select(state.layer, +$("head").value));
  for (const id of ["block-temperature", "block-top-k", "block-top-p"]) {
    $(id).addEventListener("input", () => { if (state.block) drawSampler(); });
  }
  $("stretch").addEventListener("change", () => {
    state.stretch = $("stretch").checked;
    if (state.data && state.kind) { renderOverview(entry()); drawHead(); }
  });
  $("file").addEventListener("change", pickFile);
  $("test-index").addEventListener("change", () => { state.image = { example: Math.max(0, +$("test-index").value || 0) }; });
  $("word-layer").addEventListener("change", drawWordMaps);
  $("word-head").addEventListener("change", drawWordMaps);
  $("ablate-head").addEventListener("click", ablateHead);
  $("patch-run").addEventListener("click", patchFromInput);
  $("patch-text").addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); patchFromInput(); } });
  $("heatmap").addEventListener("mousemove", heatHover);
  $("heatmap").addEventListener("mouseleave", () => { $("heat-tip").textContent = "\u00a0"; });
  drawColorbar();
  const embedded = $("qkv-data");
  if (embedded) {
    await initStandalone(JSON.parse(embedded.textContent));
    return;
  }
  try {
    applyInfo(await api("/api/info"));
  } catch (e) {
    showError("Could not load the model's description (/api/info): " + e.message);
  }
}

function applyInfo(info) {
  state.info = info;
  $("family").textContent = info.family;
  $("run-dir").textContent = info.run_dir;
  // an encoder-decoder (translation, captions) has two stacks, each its own depth
  const per = info.layers_per_kind || {};
  const layers = per.encoder !== undefined && per.decoder !== undefined
    ? `encoder ${per.encoder} + decoder ${per.decoder} layers`
    : `${info.n_layers} layers`;
  $("dims").textContent = `${layers} × ${info.n_heads} heads, d_k = ${info.d_k}`;
  $("input-label").textContent = info.input_label || "Input";
  $("run").textContent = RUN_LABELS[info.family] || "Run";
  const input = $("input");
  if (info.max_chars) input.maxLength = info.max_chars;
  input.value = info.example || "";
  for (const node of document.querySelectorAll("[data-family]")) {
    node.hidden = !node.dataset.family.split(" ").includes(info.family);
  }
  document.title = `qkv · explain · ${info.family}`;
  const image = isImage();
  for (const id of ["input", "char-count"]) $(id).hidden = image;
  $("image-input").hidden = !image;  // #image-card shows once there is a result to draw
  if (image && !state.standalone) {
    $("input-label").htmlFor = "file";
    $("upload-cap").textContent = `${info.image_size}×${info.image_size} px input, ${info.grid_size}×${info.grid_size} ` +
      `patches of ${info.patch_size}×${info.patch_size}; uploads up to ${(info.max_upload_bytes / 2 ** 20).toFixed(0)} MiB`;
    loadExamples();
  }
  updateCount();
}

// ---------- standalone page: everything comes from the embedded data

async function initStandalone(payload) {
  state.standalone = payload;
  document.body.classList.add("standalone");
  applyInfo(payload.info);
  const box = $("standalone-input");
  const input = payload.body.image !== undefined ? payload.body.image : payload.body.text;
  box.replaceChildren(el("p", { class: "out-text", id: "standalone-text" }, input));
  if (payload.notes.length) {
    box.append(el("ul", { class: "notes", id: "notes" }, ...payload.notes.map((n) => el("li", {}, n))));
  }
  box.append(el("p", { class: "muted small" },
    "A standalone page (qkv.show, or qkv explain --html): the model ran once on this input; " +
    "every view below is drawn from the numbers saved in the page, and nothing is fetched. " +
    "For another input, make another page, or run qkv explain RUN --serve."));
  box.hidden = false;
  try {
    const data = payload.explanation;
    for (const a of data.attention) a.weights = unpackWeights(a.weights);
    showResult(data, payload.body, isImage() ? await loadPicture(data.output.image) : null);
  } catch (e) {
    showError(e.message);
  }
}

// Little-endian float32 values, base64-encoded by the Python side.
function decodeFloat32(b64) {
  const bin = atob(b64), view = new DataView(new ArrayBuffer(bin.length));
  for (let i = 0; i < bin.length; i++) view.setUint8(i, bin.charCodeAt(i));
  const out = new Float64Array(bin.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

// Attention weights packed by the Python side, {uint16: base64, shape: [L, H, Tq, Tk]} with
// each weight × 65535, as the nested arrays the server sends: W[layer][head][query][key].
function unpackWeights(packed) {
  const bin = atob(packed.uint16), [L, H, tq, tk] = packed.shape;
  const level = (n) => (bin.charCodeAt(2 * n) | (bin.charCodeAt(2 * n + 1) << 8)) / 65535;
  let n = 0;
  return [...Array(L)].map(() => [...Array(H)].map(() => [...Array(tq)].map(() =>
    [...Array(tk)].map(() => level(n++)))));
}

// Rows of one head from a flat (H, T, d) array: T arrays of d numbers.
function headRows(flat, head, T, d) {
  return [...Array(T).keys()].map((t) => Array.from(flat.subarray((head * T + t) * d, (head * T + t + 1) * d)));
}

// Eq. 1 for one head from the saved Q, K, V and mask, as qkv.nn.attention.attention_steps
// computes it: scores = QKᵀ, scaled = scores / √d_k, masked (null = −∞), weights = softmax
// over each row (a row with nothing to attend to is all zeros), output = weights · V.
function localSteps(kind, layer, head) {
  const S = state.standalone.steps[kind], saved = S.layers[layer], d = S.d_k;
  const tq = S.query_tokens.length, tk = S.key_tokens.length, key = `${kind}/${layer}`;
  if (!state.decoded[key]) {
    state.decoded[key] = { q: decodeFloat32(saved.q), k: decodeFloat32(saved.k), v: decodeFloat32(saved.v) };
  }
  const flat = state.decoded[key];
  const q = headRows(flat.q, head, tq, d), k = headRows(flat.k, head, tk, d), v = headRows(flat.v, head, tk, d);
  const mask = q.map((_, i) => k.map((_, j) => saved.mask[i * tk + j] === "1"));
  const scores = q.map((qi) => k.map((kj) => qi.reduce((a, x, c) => a + x * kj[c], 0)));
  const root = Math.sqrt(d);
  const scaled = scores.map((row) => row.map((x) => x / root));
  const masked = scaled.map((row, i) => row.map((x, j) => (mask[i][j] ? x : null)));
  const weights = masked.map((row) => {
    const top = Math.max(...row.filter((x) => x !== null));
    if (!Number.isFinite(top)) return row.map(() => 0);
    const e = row.map((x) => (x === null ? 0 : Math.exp(x - top)));
    const sum = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / sum);
  });
  const output = weights.map((w) => [...Array(d).keys()].map((c) => w.reduce((a, wj, j) => a + wj * v[j][c], 0)));
  return { kind, layer, head, d_k: d, query_tokens: S.query_tokens, key_tokens: S.key_tokens,
    q, k, v, scores, scaled, mask, masked, weights, output };
}

// ---------- ViT runs: choosing the image

async function loadExamples() {
  try {
    const { examples } = await api("/api/image/examples");
    $("examples").replaceChildren(...examples.map((ex) => {
      const button = el("button", { type: "button", class: "example", "data-index": ex.index,
        title: `test image ${ex.index} (true class: ${ex.label})` },
        el("img", { src: ex.image, alt: `test image ${ex.index}` }), el("span", {}, ex.label));
      button.addEventListener("click", () => {
        $("test-index").value = String(ex.index);
        state.image = { example: ex.index };
        run();
      });
      return button;
    }));
  } catch (e) {
    $("examples").replaceChildren(el("p", { class: "muted small" }, "No test images to pick from: " + e.message));
  }
}

function pickFile() {
  const file = $("file").files[0];
  if (!file) return;
  if (file.size > state.info.max_upload_bytes) {
    clearResult();
    showError(`${file.name}: ${file.size} bytes, the cap is ${state.info.max_upload_bytes}`);
    return;
  }
  state.image = { file };
  run();
}

function loadPicture(src) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("the model's input image could not be shown"));
    img.src = src;
  });
}

function updateCount() {
  const max = state.info ? state.info.max_chars : null;
  const n = $("input").value.length;
  $("char-count").textContent = max ? `${n} / ${max}` : `${n}`;
  $("char-count").classList.toggle("over", Boolean(max) && n > max);
}

// ---------- running the model

function requestBody() {
  const num = (id, parse) => {
    const v = $(id).value.trim();
    const n = v === "" ? NaN : parse(v);
    return Number.isFinite(n) ? n : null;
  };
  const body = {
    text: $("input").value,
    beam_size: num("beam-size", parseInt) ?? 4,
    max_new_tokens: num("max-new-tokens", parseInt) ?? 40,
    temperature: num("temperature", parseFloat) ?? 1.0,
    top_k: num("top-k", parseInt),
    top_p: num("top-p", parseFloat),
    seed: num("seed", parseInt),
  };
  // An LM samples its continuation and /api/steps runs the model again: both requests must
  // use one seed or the step-through would describe a different sample than the heatmap.
  const sampling = state.info && ["lm", "diffusion-lm"].includes(state.info.family);
  if (sampling && body.seed === null) {
    body.seed = Math.floor(Math.random() * 2 ** 31);
  }
  // A diffusion LM: the attention on the input of the step picked in the trajectory (null: the last).
  if (state.info && state.info.family === "diffusion-lm") body.step = state.step ?? null;
  return body;
}

// The button says what the model does with the input.
const RUN_LABELS = { translation: "Translate", lm: "Generate", "diffusion-lm": "Generate", vit: "Classify", caption: "Caption" };

function setBusy(on) {
  $("run").disabled = on;
  $("run").textContent = on ? "Running…" : (RUN_LABELS[state.info && state.info.family] || "Run");
}

async function run() {
  if (state.standalone) return;  // no model behind a standalone page
  const seq = ++state.runSeq;  // a newer run makes older answers stale
  hideError();
  delete document.body.dataset.ready;
  setBusy(true);
  const image = isImage();
  const body = image ? (state.image || { example: Math.max(0, +$("test-index").value || 0) }) : requestBody();
  try {
    const data = image ? await imageApi("/api/image/explain", body) : await api("/api/explain", body);
    const picture = image ? await loadPicture(data.output.image) : null;
    if (seq !== state.runSeq) return;
    showResult(data, body, picture);
  } catch (e) {
    if (seq !== state.runSeq) return;
    clearResult();
    showError(e.message);
  } finally {
    if (seq === state.runSeq) setBusy(false);
  }
}

// The last run's answer (output, attention, block, interventions, step-through), cleared when a
// new input is refused: nothing on the page answers an input it was not computed from.
function clearResult() {
  Object.assign(state, { data: null, body: null, block: null, picture: null, heat: null });
  state.ivSeq++;
  state.stepSeq++;
  clearTimeout(state.stepTimer);
  $("output").replaceChildren(el("p", { class: "muted" }, "No output: the input was refused (the message above says why)."));
  for (const id of ["image-card", "caption-card", "block-card", "ablate-controls", "ablate-result", "block-intervene"]) {
    $(id).hidden = true;
  }
  ["head-view", "overview", "image-overview", "word-maps", "block-tokens"].forEach((id) => $(id).replaceChildren());
  $("steps").replaceChildren(el("p", { class: "muted" }, "Run the model, then pick a layer and head."));
  for (const id of ["kind", "layer", "head"]) { $(id).replaceChildren(); $(id).disabled = true; }
  $("attn-title").textContent = "";
  const cv = $("heatmap");
  cv.getContext("2d").clearRect(0, 0, cv.width, cv.height);
  for (const key of ["ready", "stepsReady", "blockReady", "interveneReady"]) delete document.body.dataset[key];
}

// Draw one answer of the model (`data`, as /api/explain answers) to the request `body`.
function showResult(data, body, picture) {
  state.picture = picture;
  $("image-card").hidden = !isViT();
  $("caption-card").hidden = !isCaption();
  state.data = data;
  state.body = body;
  renderOutput(data, body);
  setupInterventions();
  setupBlock((data.output || {}).block);
  if (isCaption()) setupWordMaps();
  if ((data.attention || []).length) {
    setupSelectors();
  } else {  // nothing to draw: clear the views of a previous run rather than leave them stale
    ["head-view", "overview", "image-overview", "steps"].forEach((id) => $(id).replaceChildren());
    state.heat = null;
  }
  document.body.dataset.ready = "1";
}

// ---------- output panel

function renderOutput(data, body) {
  const out = $("output"), o = data.output || {};
  out.replaceChildren();
  if (data.family === "translation") {
    out.append(el("p", { class: "out-text", id: "output-text" }, o.text ?? ""));
    if (o.decoding) out.append(el("p", { class: "muted small" }, o.decoding));  // as the model decoded
    if (o.unknown_characters && o.unknown_characters.length) {  // qkv translate's warning
      out.append(el("p", { class: "warning", id: "unknown-characters" },
        "unknown characters (not in the model's vocabulary, read as <unk>): " +
        o.unknown_characters.map((c) => JSON.stringify(c)).join(", ")));
    }
  } else if (data.family === "lm") {
    // The prompt in grey, the model's own continuation in the accent colour.
    out.append(el("p", { class: "out-text lm", id: "output-text" },
      el("span", { class: "prompt" }, body.text), el("span", { class: "continuation" }, o.text ?? "")));
    out.append(el("p", { class: "muted small" },
      (body.temperature === 0 ? "greedy decoding" : `sampled with temperature ${body.temperature}, seed ${body.seed ?? "random"}`) +
      (body.top_k ? `, top-k ${body.top_k}` : "") + (body.top_p ? `, top-p ${body.top_p}` : "")));
    out.append(el("h3", {}, "Next-token probabilities after the prompt"));
    out.append(bars("next-tokens", (o.next_tokens || []).map((t) => [showToken(t.token), t.prob])));
  } else if (data.family === "diffusion-lm") {
    out.append(el("p", { class: "out-text", id: "output-text" }, o.text ?? ""));
    out.append(el("p", { class: "muted small" },
      `${o.steps} denoising steps, ` +
      (body.temperature === 0 ? "the most likely token kept at each" : `sampled with temperature ${body.temperature}, seed ${body.seed}`) +
      `; the attention below is on the input of step ${o.step} (▒: still masked)`));
    out.append(el("h3", {}, "Denoising trajectory"));
    out.append(trajectoryView(o.trajectory, o.steps, o.step));
  } else if (data.family === "vit") {
    out.append(el("p", { class: "out-text", id: "output-text" }, `predicted: ${o.prediction}`));
    out.append(el("p", { class: "muted small" }, data.input));
    out.append(el("h3", {}, "Class probabilities"));
    out.append(bars("classes", o.classes.map((c) => [c.label, c.prob])));
  } else if (data.family === "caption") {
    out.append(el("p", { class: "out-text", id: "output-text" }, o.text || "(an empty caption)"));
    out.append(el("p", { class: "muted small" }, `${o.decoding}; ${data.input}`));
  } else if (data.family === "protein") {
    if (o.classes && o.classes.length) {
      out.append(el("h3", {}, "Class probabilities"));
      out.append(bars("classes", o.classes.map((c) => [c.label, c.prob])));
    } else if (o.residues) {
      out.append(el("h3", {}, "Predicted class of each residue"));
      out.append(residueView(body.text.replace(/\s+/g, ""), o.residues));
    } else {
      out.append(el("p", { class: "muted" }, "This run has no classification head: attention only."));
    }
  } else if (data.family === "text") {
    renderTextOutput(out, o);
  }
}

// A sentence encoder (MiniLM, BERT, a text-cls run): the class probabilities of a trained
// head; the cosine similarity of a pair; for one sentence, what its embedding is made of.
function renderTextOutput(out, o) {
  if (o.classes && o.classes.length) {
    out.append(el("h3", {}, "Class probabilities"));
    out.append(bars("classes", o.classes.map((c) => [c.label, c.prob])));
  }
  if (o.similarity) {
    const s = o.similarity;
    out.append(el("p", { class: "out-text", id: "output-text" }, `cosine similarity ${fmt(s.cosine, 3)}`));
    out.append(similarityBar(s.cosine));
    out.append(el("p", { class: "muted small" },
      "Each sentence is encoded alone; its embedding is the mean of the final hidden states over its " +
      "tokens, L2-normalised (sentence-transformers' pooling, as qkv similarity computes it). " +
      "1: the same direction, 0: unrelated, below 0: opposed. The attention below is of the pair " +
      "read together, [CLS] first [SEP] second [SEP], with BERT's token types."));
  } else if (o.embedding) {
    const e = o.embedding;
    out.append(el("p", { class: "out-text", id: "output-text" },
      `a sentence embedding of ${e.dim} numbers (norm ${fmt(e.norm, 2)} before L2 normalisation)`));
    out.append(el("h3", {}, "Its words closest to it (each word encoded alone; cosine similarity)"));
    out.append(bars("closest-words", e.closest_words.map((w) => [w.word, w.cosine]), (c) => fmt(c, 3)));
    out.append(el("p", { class: "muted small" },
      "The embedding is the mean of the final hidden states over the tokens (sentence-transformers' " +
      "pooling). Give a pair, first ||| second, to see the two sentences' cosine similarity."));
  }
}

// A bar from −1 to 1 with a tick at 0, filled from 0 to the cosine.
function similarityBar(cosine) {
  const c = Math.max(-1, Math.min(1, cosine));
  const fill = el("div", { class: "bar-fill" });
  fill.style.marginLeft = `${50 * (1 + Math.min(0, c))}%`;
  fill.style.width = `${50 * Math.abs(c)}%`;
  return el("div", { class: "bars", id: "similarity" }, el("div", { class: "bar-row best" },
    el("span", { class: "bar-label" }, "−1 … 1"), el("div", { class: "bar-track signed" }, fill),
    el("span", { class: "bar-value" }, fmt(c, 3))));
}

// Horizontal bars; widths are absolute probabilities (or cosines) so charts of different runs
// compare. `value` formats the number at the end of a bar.
function bars(id, items, value = (p) => `${(p * 100).toFixed(1)} %`) {
  const wrap = el("div", { class: "bars", id });
  const best = Math.max(...items.map((it) => it[1]));
  for (const [label, p] of items) {
    const fill = el("div", { class: "bar-fill" });
    fill.style.width = `${Math.max(0, Math.min(1, p)) * 100}%`;
    wrap.append(el("div", { class: "bar-row" + (p === best ? " best" : "") },
      el("span", { class: "bar-label", title: label }, label),
      el("div", { class: "bar-track" }, fill),
      el("span", { class: "bar-value" }, value(p))));
  }
  return wrap;
}

// A masked diffusion LM's trajectory: each token coloured by the step that unmasked it (dark:
// early, light: late; grey: given), its confidence on hover. On a served page a click on a
// token shows the attention on the input of the step that unmasked it.
function trajectoryView(rows, steps, shown) {
  const wrap = el("div", { class: "trajectory", id: "trajectory" });
  for (const r of rows) {
    const given = r.step < 0;
    const span = el("span", {
      class: "traj-token" + (given ? " given" : "") + (r.step === shown ? " shown" : ""),
      title: given ? "given" : `unmasked at step ${r.step}, p = ${r.confidence}`,
    }, showToken(r.token));
    if (!given) {
      const t = steps > 1 ? r.step / (steps - 1) : 0;
      span.style.background = `hsl(${230 - 180 * t}, 65%, ${35 + 35 * t}%)`;
      if (!state.standalone) span.addEventListener("click", () => { state.step = r.step; run(); });
    }
    wrap.append(span);
  }
  wrap.append(el("p", { class: "muted small" }, state.standalone
    ? "Colour: the step that unmasked each token, dark (early) to light (late); grey: given. Hover for its confidence."
    : "Colour: the step that unmasked each token, dark (early) to light (late); grey: given. Hover for its confidence; click a token for the attention at its step."));
  return wrap;
}

// Sequence and predicted labels in monospace blocks of 50, so label i sits under residue i.
function residueView(seq, labels) {
  const wrap = el("div", { class: "residues", id: "residues" });
  const letters = [...new Set(labels)].sort();
  const tint = (c) => `lab-${letters.indexOf(c) % 6}`;
  for (let start = 0; start < Math.max(seq.length, labels.length); start += 50) {
    const lab = el("div", { class: "res-line labels" });
    for (const c of labels.slice(start, start + 50)) lab.append(el("span", { class: tint(c) }, c));
    wrap.append(el("div", { class: "res-block" },
      el("div", { class: "res-pos" }, String(start + 1)),
      el("div", { class: "res-lines" }, el("div", { class: "res-line seq" }, seq.slice(start, start + 50)), lab)));
  }
  const share = (c) => (100 * [...labels].filter((x) => x === c).length / labels.length).toFixed(0);
  const counts = letters.map((c) => `${c} ${share(c)} %`);
  wrap.append(el("p", { class: "muted small" }, "labels: " + counts.join(" · ")));
  return wrap;
}

// ---------- attention panel

function fillSelect(sel, items, value) {
  sel.replaceChildren(...items.map(([v, label]) => el("option", { value: v }, label)));
  sel.value = String(value);
  sel.disabled = false;
}

function entry() { return state.data.attention.find((a) => a.kind === state.kind); }

function setupSelectors() {
  const kinds = state.data.attention.map((a) => a.kind);
  if (!kinds.includes(state.kind)) state.kind = kinds[0];
  fillSelect($("kind"), state.data.attention.map((a) => [a.kind, a.kind]), state.kind);
  selectKind();
}

function selectKind() {
  const e = entry(), L = e.weights.length, H = e.weights[0].length;
  state.layer = Math.min(state.layer, L - 1);
  state.head = Math.min(state.head, H - 1);
  fillSelect($("layer"), [...Array(L).keys()].map((i) => [i, String(i + 1)]), state.layer);
  fillSelect($("head"), [...Array(H).keys()].map((i) => [i, String(i + 1)]), state.head);
  $("attn-title").textContent = e.title || "";
  renderOverview(e);
  if (isViT()) renderOverview(e, $("image-overview"), paintImageTile);
  select(state.layer, state.head);
}

// Layers and heads are 0-based in the API and 1-based on screen.
function select(layer, head) {
  state.layer = layer;
  state.head = head;
  $("layer").value = String(layer);
  $("head").value = String(head);
  drawHead();
  // Debounced: arrowing through heads should not queue a model run per keystroke.
  delete document.body.dataset.stepsReady;
  clearTimeout(state.stepTimer);
  state.stepTimer = setTimeout(loadSteps, 150);
}

function drawHead() {
  const e = entry(), W = e.weights[state.layer][state.head];
  renderHeadView(e, W);  // opacity stays ∝ weight: stretched, a diffuse head is a solid block of lines
  renderHeatmap(e, W, scaleMax(W));
  if (isViT()) drawImageViews(W);
  for (const tile of document.querySelectorAll("#overview .head, #image-overview .head")) {
    tile.classList.toggle("selected", +tile.dataset.layer === state.layer && +tile.dataset.head === state.head);
  }
}

// bertviz-style: two token columns, one line per (query, key) pair.
function renderHeadView(e, W) {
  const q = e.query_tokens.map(showToken), k = e.key_tokens.map(showToken);
  const rowH = 20, pad = 8, colW = 130, gap = 150;
  const width = 2 * colW + gap, height = Math.max(q.length, k.length) * rowH + 2 * pad;
  const y = (i) => pad + i * rowH + rowH / 2;
  const svg = svgEl("svg", { class: "hv", width, height, viewBox: `0 0 ${width} ${height}` });
  const lines = svgEl("g");
  svg.append(lines);
  const byQ = q.map(() => []), byK = k.map(() => []);
  W.forEach((row, i) => row.forEach((w, j) => {
    if (w < 0.005) return;  // invisible anyway; skipping keeps long inputs responsive
    const line = svgEl("line", { x1: colW + 6, y1: y(i), x2: colW + gap - 6, y2: y(j),
      "stroke-opacity": w.toFixed(3) });
    lines.append(line); byQ[i].push(line); byK[j].push(line);
  }));
  const token = (label, x, yy, anchor, links, tip) => {
    const t = svgEl("text", { x, y: yy, "text-anchor": anchor, class: "tok" });
    t.textContent = shorten(label);
    const title = svgEl("title"); title.textContent = tip; t.append(title);
    t.addEventListener("mouseenter", () => {
      svg.classList.add("focus"); t.classList.add("hl");
      links.forEach((l) => l.classList.add("hl"));
    });
    t.addEventListener("mouseleave", () => {
      svg.classList.remove("focus"); t.classList.remove("hl");
      links.forEach((l) => l.classList.remove("hl"));
    });
    svg.append(t);
  };
  q.forEach((s, i) => token(s, colW, y(i), "end", byQ[i], `query ${i}: ${s}`));
  k.forEach((s, j) => token(s, colW + gap, y(j), "start", byK[j], `key ${j}: ${s}`));
  $("head-view").replaceChildren(svg);
}

function renderHeatmap(e, W, vmax) {
  const q = e.query_tokens.map(showToken), k = e.key_tokens.map(showToken);
  const cv = $("heatmap"), ctx = cv.getContext("2d");
  const n = Math.max(q.length, k.length);
  const cell = Math.max(3, Math.min(26, Math.floor(420 / n)));
  const labels = cell >= 9;  // below that, labels would overlap: the hover read-out names cells
  ctx.font = "11px system-ui, sans-serif";
  const textW = (arr) => Math.min(110, Math.max(0, ...arr.map((s) => ctx.measureText(shorten(s, 14)).width)));
  // Whole pixels: fractional offsets would anti-alias every cell edge into faint seams.
  const left = Math.ceil(labels ? textW(q) + 10 : 6), top = Math.ceil(labels ? textW(k) + 10 : 6);
  const w = left + k.length * cell + 4, h = top + q.length * cell + 4;
  const dpr = window.devicePixelRatio || 1;
  cv.width = w * dpr; cv.height = h * dpr;
  cv.style.width = `${w}px`; cv.style.height = `${h}px`;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  W.forEach((row, i) => row.forEach((v, j) => {
    ctx.fillStyle = rgb(blues(v / vmax));
    ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
  }));
  ctx.strokeStyle = "#c9ced6";
  ctx.strokeRect(left - 0.5, top - 0.5, k.length * cell + 1, q.length * cell + 1);
  if (labels) {
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#333";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    q.forEach((s, i) => ctx.fillText(shorten(s, 14), left - 5, top + i * cell + cell / 2));
    ctx.textAlign = "left";
    k.forEach((s, j) => {
      ctx.save();
      ctx.translate(left + j * cell + cell / 2, top - 5);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(shorten(s, 14), 0, 0);
      ctx.restore();
    });
  }
  state.heat = { left, top, cell, q, k, W };
  drawColorbar(Math.max(120, q.length * cell), top, vmax);
}

function heatHover(ev) {
  const g = state.heat;
  if (!g) return;
  const r = ev.target.getBoundingClientRect();
  const i = Math.floor((ev.clientY - r.top - g.top) / g.cell), j = Math.floor((ev.clientX - r.left - g.left) / g.cell);
  const ok = i >= 0 && j >= 0 && i < g.q.length && j < g.k.length;
  $("heat-tip").textContent = ok ? `query ${i} “${g.q[i]}” → key ${j} “${g.k[j]}”: ${fmt(g.W[i][j], 3)}` : "\u00a0";
}

function drawColorbar(height = 200, top = 6, vmax = 1) {
  const cv = $("colorbar"), ctx = cv.getContext("2d"), dpr = window.devicePixelRatio || 1;
  const w = 60, h = top + height + 8;
  cv.width = w * dpr; cv.height = h * dpr;
  cv.style.width = `${w}px`; cv.style.height = `${h}px`;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  for (let y = 0; y < height; y++) {
    ctx.fillStyle = rgb(blues(1 - y / (height - 1)));
    ctx.fillRect(6, top + y, 14, 1);
  }
  ctx.strokeStyle = "#c9ced6";
  ctx.strokeRect(5.5, top - 0.5, 15, height + 1);
  ctx.fillStyle = "#333";
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  for (const t of [0, 0.25, 0.5, 0.75, 1]) ctx.fillText((t * vmax).toFixed(vmax < 0.1 ? 3 : 2), 25, top + (1 - t) * (height - 1));
}

// One small canvas per head, drawn pixel-per-cell and scaled up by CSS: cheap even for long inputs.
function paintHeatTile(W) {
  const tq = W.length, tk = W[0] ? W[0].length : 0, vmax = scaleMax(W);
  const cv = el("canvas", { width: Math.max(1, tk), height: Math.max(1, tq) });
  if (tq && tk) {
    const ctx = cv.getContext("2d"), img = ctx.createImageData(tk, tq);
    W.forEach((row, i) => row.forEach((v, j) => {
      const c = blues(v / vmax), o = 4 * (i * tk + j);
      img.data[o] = c[0]; img.data[o + 1] = c[1]; img.data[o + 2] = c[2]; img.data[o + 3] = 255;
    }));
    ctx.putImageData(img, 0, 0);
  }
  return cv;
}

// The tiles of every layer × head; paint(W) draws one head's weights into a new canvas.
function renderOverview(e, host = $("overview"), paint = paintHeatTile) {
  const L = e.weights.length, H = e.weights[0].length;
  host.style.gridTemplateColumns = `auto repeat(${H}, max-content)`;
  const nodes = [el("div", { class: "ov-corner" })];
  for (let h = 0; h < H; h++) nodes.push(el("div", { class: "ov-label col" }, `head ${h + 1}`));
  for (let l = 0; l < L; l++) {
    nodes.push(el("div", { class: "ov-label row" }, `layer ${l + 1}`));
    for (let h = 0; h < H; h++) {
      const cv = paint(e.weights[l][h]);
      const tile = el("button", { type: "button", class: "head", title: `layer ${l + 1}, head ${h + 1}`,
        "data-layer": l, "data-head": h, "aria-label": `layer ${l + 1}, head ${h + 1}` }, cv);
      tile.addEventListener("click", () => select(l, h));
      nodes.push(tile);
    }
  }
  host.replaceChildren(...nodes);
}

// ---------- ViT runs: attention over the image

// The class token's row of one head, W[0][1..N], as grid × grid rows of patch weights.
function clsGrid(W) {
  const g = state.data.output.grid_size, row = W[0].slice(1);
  return [...Array(g).keys()].map((r) => row.slice(r * g, (r + 1) * g));
}

// The model's input scaled to `size` px, one value per patch on top (orange, opacity ∝
// value / vmax), and the patch grid.
function drawOverlay(cv, values, vmax, size) {
  const g = values.length, cell = size / g, dpr = window.devicePixelRatio || 1;
  cv.width = Math.round(size * dpr); cv.height = Math.round(size * dpr);
  cv.style.width = `${size}px`; cv.style.height = `${size}px`;
  const ctx = cv.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.imageSmoothingEnabled = false;
  if (state.picture) ctx.drawImage(state.picture, 0, 0, size, size);
  values.forEach((row, r) => row.forEach((v, c) => {
    const t = Math.max(0, Math.min(1, v / (vmax || 1)));
    ctx.fillStyle = `rgba(255, 96, 0, ${(0.65 * t).toFixed(3)})`;  // the image shows through
    ctx.fillRect(c * cell, r * cell, cell, cell);
  }));
  ctx.strokeStyle = "rgba(255, 255, 255, 0.45)";
  ctx.lineWidth = 1;
  ctx.beginPath();
  for (let k = 1; k < g; k++) {
    ctx.moveTo(k * cell, 0); ctx.lineTo(k * cell, size);
    ctx.moveTo(0, k * cell); ctx.lineTo(size, k * cell);
  }
  ctx.stroke();
}

const gridMax = (values) => Math.max(0, ...values.flat());

function paintImageTile(W) {
  const cv = el("canvas"), values = clsGrid(W);
  drawOverlay(cv, values, gridMax(values), 78);
  return cv;
}

function drawImageViews(W) {
  const o = state.data.output, values = clsGrid(W), vmax = gridMax(values);
  drawOverlay($("overlay"), values, vmax, 336);
  $("overlay-caption").textContent = `Layer ${state.layer + 1}, head ${state.head + 1}: class token → patches ` +
    `(largest ${fmt(vmax, 3)}; CLS → CLS ${fmt(W[0][0], 3)})`;
  drawOverlay($("rollout"), o.rollout, gridMax(o.rollout), 336);
  $("rollout-note").textContent = `The class token keeps ${fmt(o.rollout_cls, 3)} of itself; the patches share the rest.`;
}

// ---------- caption runs: where each word looks (Show, Attend and Tell, Xu et al. 2015, Fig. 2, 3)

function setupWordMaps() {
  const o = state.data.output, L = o.n_decoder_layers, H = o.n_heads;
  const layer = $("word-layer").value === "" ? L - 1 : Math.min(+$("word-layer").value, L - 1);
  const head = $("word-head").value === "" || +$("word-head").value >= H ? "mean" : $("word-head").value;
  fillSelect($("word-layer"), [...Array(L).keys()].map((i) => [i, String(i + 1)]), layer);
  fillSelect($("word-head"), [["mean", "mean of heads"], ...[...Array(H).keys()].map((h) => [h, String(h + 1)])], head);
  drawWordMaps();
}

// One word's grid × grid map of a decoder layer: one head's, or the mean over the heads.
function wordGrid(maps, layer, head) {
  const heads = maps[layer];
  if (head !== "mean") return heads[+head];
  return heads[0].map((row, r) => row.map((_, c) => heads.reduce((a, h) => a + h[r][c], 0) / heads.length));
}

// The input, then one tile per word in caption order: the image with the word's map over it.
function drawWordMaps() {
  if (!state.data || !isCaption()) return;
  const o = state.data.output, layer = +$("word-layer").value, head = $("word-head").value;
  const input = el("canvas");
  drawOverlay(input, [[0]], 1, 112);  // the image alone
  const tiles = [el("figure", { class: "word-map" }, input, el("figcaption", { class: "muted" }, "input"))];
  o.words.forEach((w, i) => {
    const values = wordGrid(w.maps, layer, head), vmax = gridMax(values), cv = el("canvas");
    drawOverlay(cv, values, vmax, 112);
    tiles.push(el("figure", { class: "word-map", "data-word": i, title: `pieces: ${w.pieces.join(" ")}` }, cv,
      el("figcaption", {}, w.text || "∅"), el("span", { class: "muted small" }, `max ${fmt(vmax, 3)}`)));
  });
  if (!o.words.length) tiles.push(el("p", { class: "muted" }, "The model wrote an empty caption: no word to show."));
  $("word-maps").replaceChildren(...tiles);
}

// ---------- follow a token through the block (output.block: qkv.explain.block.follow_tokens)

const NORM_NAMES = { layernorm: "LayerNorm", rmsnorm: "RMSNorm", dyt: "DyT" };
const SUBLAYER_NAMES = { self_attn: "self-attention", cross_attn: "cross-attention", ffn: "FFN" };

function setupBlock(block) {
  state.block = block || null;
  $("block-card").hidden = !block;
  delete document.body.dataset.blockReady;
  if (!block) return;
  const host = $("block-tokens");
  host.replaceChildren(...block.tokens.map((t, i) => {
    const b = el("button", { type: "button", "aria-pressed": "false", "data-token": i, title: `token ${i}` },
      shorten(showToken(t), 14));
    b.addEventListener("click", () => selectBlockToken(i));
    return b;
  }));
  // The last token by default: an LM's next-token prediction is read there.
  selectBlockToken(block.tokens.length - 1);
}

function selectBlockToken(t) {
  state.blockToken = t;
  for (const b of $("block-tokens").children) b.setAttribute("aria-pressed", String(+b.dataset.token === t));
  drawStream();
  drawNorms();
  drawFfn();
  drawLens();
  drawSampler();
  document.body.dataset.blockReady = "1";
}

// One row per layer: the stream entering it, then each sub-layer's output and the stream after it.
function drawStream() {
  const B = state.block, t = state.blockToken;
  let top = 0;
  for (const L of B.layers) {
    top = Math.max(top, L.resid_pre[t]);
    for (const s of L.sublayers) top = Math.max(top, s.out_norm[t], s.resid_post_norm[t]);
  }
  const bar = (label, v, cls) => {
    const fill = el("div", { class: "bar-fill" });
    fill.style.width = `${top > 0 ? (100 * v) / top : 0}%`;
    return [el("span", {}, label), el("div", { class: "bar-track " + cls }, fill), el("span", { class: "bar-value" }, fmt(v, 2))];
  };
  $("block-stream").replaceChildren(...B.layers.map((L, i) => {
    const rows = [...bar("‖x‖ in", L.resid_pre[t], "")];
    for (const s of L.sublayers) {
      rows.push(...bar(`+ ${SUBLAYER_NAMES[s.name] || s.name} ‖Δ‖`, s.out_norm[t], "delta"));
      rows.push(...bar("= ‖x‖", s.resid_post_norm[t], ""));
    }
    return el("div", { class: "stream-row", "data-layer": i }, el("strong", {}, `layer ${i + 1}`),
      el("div", { class: "stream-bars" }, ...rows));
  }));
}

function drawNorms() {
  const B = state.block, t = state.blockToken, name = NORM_NAMES[B.norm] || B.norm;
  $("block-norm-caption").textContent = `${name} ${B.norm_first ? "before each sub-layer (pre-LN)" :
    "after each residual add (post-LN)"}: the token's features, mean and standard deviation, before → after`;
  const head = el("tr", {}, ...["layer", "sub-layer", "mean before", "std before", "mean after", "std after"].map((h) => el("th", {}, h)));
  const rows = [];
  B.layers.forEach((L, i) => L.sublayers.forEach((s) => rows.push(el("tr", {},
    el("td", {}, String(i + 1)), el("td", {}, SUBLAYER_NAMES[s.name] || s.name),
    el("td", {}, fmt(s.norm_in.mean[t], 3)), el("td", {}, fmt(s.norm_in.std[t], 3)),
    el("td", {}, fmt(s.norm_out.mean[t], 3)), el("td", {}, fmt(s.norm_out.std[t], 3))))));
  $("block-norms").replaceChildren(el("table", { class: "block-table" }, head, ...rows));
}

function drawFfn() {
  const B = state.block, t = state.blockToken, zero = canIntervene("zero_neuron");
  $("block-ffn").replaceChildren(...B.layers.map((L, i) => {
    const top = L.ffn_top[t], best = Math.max(1e-9, ...top.map((n) => Math.abs(n[1])));
    const chart = bars(null, top.map(([n, v]) => [`neuron ${n}`, Math.abs(v) / best]), (p) => fmt(p * best, 3));
    if (zero) {  // a "zero this neuron" button at the end of each row
      chart.classList.add("with-action");
      [...chart.querySelectorAll(".bar-row")].forEach((row, k) => {
        const n = top[k][0];
        const button = el("button", { type: "button", class: "zero", "data-layer": i, "data-neuron": n,
          title: `zero this neuron: neuron ${n} of layer ${i + 1}, at every position`,
          "aria-label": `zero this neuron: neuron ${n} of layer ${i + 1}` }, "zero");
        button.addEventListener("click", () => zeroNeuron(i, n, button));
        row.append(button);
      });
    }
    return el("div", { class: "ffn-layer" }, el("strong", {}, `layer ${i + 1}`), chart);
  }));
}

function drawLens() {
  const B = state.block, t = state.blockToken;
  const head = el("tr", {}, el("th", {}, "after layer"), ...[1, 2, 3, 4, 5].map((k) => el("th", {}, `#${k}`)));
  const rows = B.layers.map((L, i) => el("tr", { "data-layer": i }, el("td", {}, String(i + 1)),
    ...L.lens[t].map(([label, p]) => {
      const cell = el("td", { class: "tok", title: `${(p * 100).toFixed(2)} %` },
        `${shorten(showToken(String(label)), 12)} ${(p * 100).toFixed(1)}%`);
      cell.style.background = rgb(blues(p * 0.8));
      if (p > 0.55) cell.style.color = "#fff";
      return cell;
    })));
  $("block-lens").replaceChildren(el("table", { class: "block-table", id: "lens-table" }, head, ...rows));
}

// The distribution qkv.inference.sampling.next_token_probs draws from: logits / temperature,
// then the top-k, then the nucleus (the fewest most likely tokens reaching top-p; never empty).
function samplerProbs(logits, temperature, topK, topP) {
  let items = logits.map(([label, v]) => [label, v / temperature]).sort((a, b) => b[1] - a[1]);
  if (topK) items = items.slice(0, topK);
  const m = items.length ? items[0][1] : 0;
  let z = 0;
  for (const it of items) z += Math.exp(it[1] - m);
  items = items.map(([label, v]) => [label, Math.exp(v - m) / z]);
  if (topP && topP < 1) {
    let mass = 0, keep = 0;
    while (keep < items.length && (keep === 0 || mass < topP)) mass += items[keep++][1];
    items = items.slice(0, keep);
    const kept = items.reduce((a, it) => a + it[1], 0);
    items = items.map(([label, p]) => [label, p / kept]);
  }
  return items;
}

function drawSampler() {
  const B = state.block, t = state.blockToken;
  const temperature = Math.max(0.05, +$("block-temperature").value || 1);
  const topK = Math.max(0, Math.floor(+$("block-top-k").value || 0)) || null;
  const topP = +$("block-top-p").value > 0 ? Math.min(1, +$("block-top-p").value) : null;
  const items = samplerProbs(B.final[t], temperature, topK, topP);
  const sent = B.final[t].length;
  const note = sent < B.vocab_size
    ? `over the ${sent} most likely of ${B.vocab_size} outputs; ${items.length} kept` : `${items.length} of ${B.vocab_size} outputs kept`;
  $("block-sampler").replaceChildren(bars("sampler-bars", items.slice(0, 12).map(([l, p]) => [showToken(String(l)), p])),
    el("p", { class: "muted small", id: "sampler-note" }, note));
}

// ---------- interventions: the output before and after (POST /api/intervene; a standalone
// page looks its precomputed head ablations up instead)

// Whether this page can run intervention `what` ("ablate_head", "zero_neuron", "patch"): the
// served page of a text model asks the server; a standalone page has only its head ablations.
function canIntervene(what) {
  const iv = state.info && state.info.intervene;
  if (!iv || !iv[what]) return false;
  if (state.standalone) return what === "ablate_head" && Boolean(state.standalone.interventions && state.standalone.interventions.heads);
  return !isImage();  // the image endpoints have no intervention
}

function setupInterventions() {
  state.ivSeq++;  // an answer about the previous input is stale
  for (const id of ["ablate-result", "block-result"]) { $(id).hidden = true; $(id).replaceChildren(); }
  delete document.body.dataset.interveneReady;
  const ablate = canIntervene("ablate_head");
  $("ablate-controls").hidden = !ablate && !(state.standalone && state.standalone.interventions && state.standalone.interventions.note);
  $("ablate-head").hidden = !ablate;
  $("ablate-mode-label").hidden = !ablate || Boolean(state.standalone);  // a page holds the zero ablations
  if (state.standalone) {
    const I = state.standalone.interventions || {};
    $("ablate-note").textContent = ablate
      ? "Shows the output with the selected head's output set to zero (before W^O, §3.2.2), precomputed for every head when this page was made."
      : (I.note || "");
  }
  const patch = canIntervene("patch"), neurons = canIntervene("zero_neuron");
  $("block-intervene").hidden = !(patch || neurons);
  $("patch-controls").hidden = !patch;
  if (patch) {
    const P = state.info.intervene.patch;
    const layer = Math.min(+$("patch-layer").value || 0, P.layers - 1);
    fillSelect($("patch-layer"), [...Array(P.layers).keys()].map((i) => [i, String(i + 1)]), layer);
    $("patch-stack").textContent = state.info.kinds.length > 1 ? `${P.stack} layer` : "layer";
    $("patch-text").placeholder = state.info.example || "another input";
  }
}

function ablateHead() {
  const intervention = { kind: "ablate_head", stack: state.kind, layer: state.layer, head: state.head,
    mode: state.standalone ? "zero" : $("ablate-mode").value };
  intervene($("ablate-result"), intervention, $("ablate-head"));
}

function zeroNeuron(layer, neuron, button) {
  intervene($("block-result"), { kind: "zero_neuron", layer, neuron }, button);
}

function patchFromInput() {
  const source = $("patch-text").value;
  if (!source.trim()) { showError("Type another input to patch from."); return; }
  intervene($("block-result"), { kind: "patch", source_text: source, layer: +$("patch-layer").value,
    point: $("patch-point").value }, $("patch-run"));
}

// Run one intervention and draw the output before and after it into `host`.
async function intervene(host, intervention, button) {
  if (!state.data) return;
  const seq = ++state.ivSeq;
  hideError();
  delete document.body.dataset.interveneReady;
  host.hidden = false;
  host.replaceChildren(el("p", { class: "muted" }, "Running the model with and without the intervention…"));
  if (button) button.disabled = true;
  try {
    const r = state.standalone ? savedAblation(intervention) : await api("/api/intervene", { ...state.body, intervention });
    if (seq !== state.ivSeq) return;
    renderIntervention(host, r);
    host.scrollIntoView({ block: "nearest" });
    document.body.dataset.interveneReady = "1";
  } catch (e) {
    if (seq !== state.ivSeq) return;
    host.hidden = true;
    showError(e.message);
  } finally {
    if (button) button.disabled = false;
  }
}

// A standalone page's precomputed ablation of one head, as /api/intervene answers.
function savedAblation(iv) {
  const I = state.standalone.interventions, layers = I.heads[iv.stack];
  const h = layers && layers[iv.layer] && layers[iv.layer][iv.head];
  if (!h) throw new Error("This page holds no ablation of that head.");
  return { intervention: iv, description: h.description, before: I.before, after: h.after, changed: h.changed,
    tokens: I.tokens ? { labels: I.tokens.labels, before: I.tokens.before, after: h.tokens_after } : null };
}

// The output in one line: the text (a translation, a continuation, a filled template, a
// caption), the residue labels, the most likely classes, or a pair's cosine similarity.
function outputHeadline(o) {
  if (o.text !== null && o.text !== undefined) return o.text === "" ? "(empty)" : o.text;
  if (o.residues) return o.residues;
  if (o.classes && o.classes.length) {
    return [...o.classes].sort((a, b) => b.prob - a.prob).slice(0, 3)
      .map((c) => `${c.label} ${(100 * c.prob).toFixed(1)} %`).join(" · ");
  }
  if (o.similarity) return `cosine similarity ${fmt(o.similarity.cosine, 3)}`;
  return "(no text or class to compare: see the probabilities below)";
}

function renderIntervention(host, r) {
  const line = (label, o, cls) => [el("span", { class: "iv-label" }, label),
    el("div", { class: cls }, el("span", { class: "iv-text" }, outputHeadline(o)))];
  const parts = [
    el("p", { class: "iv-what" }, r.description),
    el("div", { class: "iv-outputs" }, ...line("before", r.before, "iv-before"), ...line("after", r.after, "iv-after")),
    el("p", { class: "iv-verdict " + (r.changed ? "changed" : "same") }, r.changed
      ? "The output changed."
      : "The output is the same" + (r.tokens ? "; the probabilities below say how much the model's confidence moved." : ".")),
  ];
  if (r.tokens && r.tokens.labels.length) parts.push(tokenChanges(r.tokens));
  host.replaceChildren(...parts);
}

// The probability of each token (or class) of the output before the intervention, without and
// with it: one column per token, the change coloured (red: less likely, blue: more).
function tokenChanges(t) {
  const n = Math.min(t.labels.length, MAX_TABLE);
  const head = el("tr", {}, el("th", {}, "token"), ...t.labels.slice(0, n).map((l) => el("th", { class: "tok" }, shorten(showToken(String(l)), 12))));
  const row = (label, values) => el("tr", {}, el("th", {}, label), ...values.slice(0, n).map((p) => el("td", {}, p === null ? "–" : `${(100 * p).toFixed(1)}%`)));
  const delta = el("tr", {}, el("th", {}, "change"), ...t.after.slice(0, n).map((p, i) => {
    const d = (p ?? 0) - (t.before[i] ?? 0), shown = fmt(100 * d, 1);
    const cell = el("td", {}, d > 0 && Number(shown) !== 0 ? "+" + shown : shown);
    const a = Math.min(1, Math.abs(d) * 2) * 0.7;
    cell.style.background = d < 0 ? `rgba(214, 39, 40, ${a.toFixed(3)})` : `rgba(31, 95, 191, ${a.toFixed(3)})`;
    if (a > 0.4) cell.style.color = "#fff";
    return cell;
  }));
  const note = t.labels.length > n ? [el("p", { class: "muted small" }, `the first ${n} of ${t.labels.length}`)] : [];
  return el("div", { class: "iv-tokens-wrap" },
    el("p", { class: "muted small" }, "Probability of each token of the output before the intervention, " +
      "the model reading that output (teacher-forced) without and with it:"),
    el("table", { class: "block-table iv-tokens" }, head, row("before", t.before), row("after", t.after), delta),
    ...note);
}

// ---------- step-through of Eq. 1

async function loadSteps() {
  if (!state.data) return;
  const seq = ++state.stepSeq, host = $("steps");
  delete document.body.dataset.stepsReady;
  if (state.info && state.info.step_through === false) {
    host.replaceChildren(el("p", { class: "muted" }, "This model's attention is additive (Bahdanau et al. 2015): " +
      "e_ij = vᵀ tanh(W s_i−1 + U h_j), a small network, not Eq. 1's scaled dot products, so there is no step-through. " +
      "Its alignment weights α are the heatmaps above."));
    document.body.dataset.stepsReady = "1";
    return;
  }
  if (isCaption() && !state.standalone && state.kind !== "encoder") {  // /api/image/steps: the encoder's
    host.replaceChildren(el("p", { class: "muted" }, "Here the step-through covers the encoder's " +
      "self-attention (kind encoder). A standalone page (qkv explain RUN --input IMAGE --html page.html) " +
      "holds every kind's Q, K and V and steps through each."));
    document.body.dataset.stepsReady = "1";
    return;
  }
  host.replaceChildren(el("p", { class: "muted" },
    `Computing ${state.kind}, layer ${state.layer + 1}, head ${state.head + 1}…`));
  try {
    const s = state.standalone ? localSteps(state.kind, state.layer, state.head) : isImage()
      ? await imageApi("/api/image/steps", state.body, { layer: state.layer, head: state.head })
      : await api("/api/steps", { ...state.body, kind: state.kind, layer: state.layer, head: state.head });
    if (seq !== state.stepSeq) return;
    renderSteps(s);
    document.body.dataset.stepsReady = "1";
  } catch (e) {
    if (seq !== state.stepSeq) return;
    host.replaceChildren(el("p", { class: "muted" }, "The step-through could not be computed."));
    showError(e.message);
  }
}

function renderSteps(s) {
  const q = s.query_tokens.map(showToken), k = s.key_tokens.map(showToken);
  const dims = [...Array(s.d_k).keys()].map((d) => `d${d}`);
  const root = Math.sqrt(s.d_k);
  const tq = q.length, tk = k.length;
  // [key, title, shape, caption, rows, cols, colour scheme, decimals]
  const stages = [
    ["q", "Q — queries", `${tq} × ${s.d_k}`, "One row per query token: this head's projection X·W_i^Q (§3.2.2).", q, dims, "signed", 2],
    ["k", "K — keys", `${tk} × ${s.d_k}`, "One row per key token, X·W_i^K; each query is compared with every key.", k, dims, "signed", 2],
    ["v", "V — values", `${tk} × ${s.d_k}`, "X·W_i^V: what each key position hands over once it is attended to.", k, dims, "signed", 2],
    ["scores", "QKᵀ — dot products", `${tq} × ${tk}`, "Similarity of every query with every key: the QKᵀ of Eq. 1 (Vaswani et al. 2017, §3.2.1).", q, k, "signed", 2],
    ["scaled", `÷ √d_k = ÷ ${root.toFixed(2)}`, `${tq} × ${tk}`, `Scaled by 1/√${s.d_k} so large d_k does not push the softmax into tiny gradients (§3.2.1, Eq. 1).`, q, k, "signed", 2],
    ["masked", "mask", `${tq} × ${tk}`, "Positions a query may not see (padding, or later tokens in a decoder) become −∞ before the softmax (§3.2.3).", q, k, "signed", 2],
    ["weights", "softmax — attention weights", `${tq} × ${tk}`, "softmax over each row of Eq. 1: weights in [0, 1], each row sums to 1 (Σ column).", q, k, "weights", 3],
    ["output", "× V — output", `${tq} × ${s.d_k}`, "weights × V: each query's output is the weighted average of the value rows (Eq. 1).", q, dims, "signed", 2],
  ];
  const host = $("steps");
  const note = el("p", { class: "muted small" },
    `${s.kind}, layer ${s.layer + 1}, head ${s.head + 1}; d_k = ${s.d_k}. Rows are query tokens` +
    (state.data.family === "translation" ? " (subword pieces, as the model sees them)." :
      state.data.family === "vit" ? " (CLS, the class token, then the patches r<row>c<column> in reading order)." :
      state.data.family === "caption" ? " (caption pieces, or the patches r<row>c<column> in reading order)." : ".") +
    " Cell colours are scaled to each table's largest |value|." +
    " Hover a score cell to see which rows of Q and K produced it.");
  const tables = {};
  const sections = stages.map(([key, title, shape, caption, rows, cols, scheme, digits], n) => {
    const { wrap, trs } = matrixTable(s[key], rows, cols, scheme, digits, key === "weights", key === "masked");
    tables[key] = trs;
    wrap.dataset.stage = key;
    return el("section", { class: "stage", id: `step-${key}` },
      el("h3", {}, el("span", { class: "step-no" }, String(n + 1)), title, el("span", { class: "shape" }, shape)),
      el("p", { class: "caption" }, caption), wrap);
  });
  host.replaceChildren(note, el("div", { class: "stages" }, ...sections));
  // Cell (i, j) of a score matrix is q_i · k_j: light up those two rows.
  host.onmouseover = (ev) => {
    const td = ev.target.closest("td[data-r]"), wrap = ev.target.closest("[data-stage]");
    for (const tr of host.querySelectorAll("tr.hl")) tr.classList.remove("hl");
    if (!td || !wrap || !["scores", "scaled", "masked", "weights"].includes(wrap.dataset.stage)) return;
    const i = +td.dataset.r, j = +td.dataset.c;
    if (tables.q[i]) tables.q[i].classList.add("hl");
    if (tables.k[j]) tables.k[j].classList.add("hl");
    if (tables.v[j]) tables.v[j].classList.add("hl");
  };
}

// A numeric table with token/dimension headers and colour-coded cells. Large matrices are
// cut to MAX_TABLE rows and columns (with a note) and scroll inside their box.
function matrixTable(M, rows, cols, scheme, digits, sumColumn, maskedStage) {
  M = M || [];
  const nr = Math.min(rows.length, MAX_TABLE), nc = Math.min(cols.length, MAX_TABLE);
  // Colours are relative to the table's largest |value| so diffuse heads still show structure;
  // the numbers in the cells are the real ones.
  let scale = 1e-9;
  for (const row of M.slice(0, nr)) for (const v of row.slice(0, nc)) if (v !== null) scale = Math.max(scale, Math.abs(v));
  const head = el("tr", {}, el("th", { class: "corner" }));
  for (const c of cols.slice(0, nc)) head.append(el("th", { class: "col", title: c }, shorten(c, 8)));
  if (sumColumn) head.append(el("th", { class: "col sum" }, "Σ"));
  const body = el("tbody");
  const trs = [];
  for (let i = 0; i < nr; i++) {
    const tr = el("tr", {}, el("th", { class: "row", title: rows[i] }, shorten(rows[i], 12)));
    const row = M[i] || [];
    for (let j = 0; j < nc; j++) {
      const v = row[j];
      const td = el("td", { "data-r": i, "data-c": j }, fmt(v, digits));
      if (v === null || v === undefined) {
        td.className = "neg-inf";
      } else {
        const c = scheme === "weights" ? blues(v / scale) : diverging(v / scale);
        td.style.background = rgb(c);
        if (c[0] + c[1] + c[2] < 360) td.style.color = "#fff";
      }
      tr.append(td);
    }
    if (sumColumn) tr.append(el("td", { class: "sum" }, fmt(row.reduce((a, b) => a + (b || 0), 0), 3)));
    trs.push(tr);
    body.append(tr);
  }
  const table = el("table", { class: "matrix" + (maskedStage ? " masked" : "") }, el("thead", {}, head), body);
  const wrap = el("div", { class: "matrix-wrap" }, table);
  if (rows.length > nr || cols.length > nc) {
    wrap.append(el("p", { class: "muted small" },
      `showing the first ${nr} of ${rows.length} rows and ${nc} of ${cols.length} columns`));
  }
  return { wrap, trs };
}

init();
