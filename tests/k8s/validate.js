// Validates JSON documents with kubernetes-models (node >= 14): the model's
// validate() (types, enums, required fields), then, by running the same
// compiled validator over a proxy that records which properties it reads,
// every field that the schema does not know (the validator reads every
// property its schema defines; maps are read key by key).
"use strict";
const fs = require("fs");
const [, , modDir, input] = process.argv;
const load = (m) => require(require.resolve(m, { paths: [modDir] }));
const out = [];
for (const d of JSON.parse(fs.readFileSync(input, "utf8"))) {
  const res = { id: d.id, errors: [] };
  out.push(res);
  const doc = d.doc, av = String(doc.apiVersion || ""), kind = String(doc.kind || "");
  const group = av.includes("/") ? av.split("/")[0] : "";
  let Cls;
  try { Cls = load("kubernetes-models/" + (group ? group + "/" : "") + av.split("/").pop())[kind]; } catch (e) { }
  if (typeof Cls !== "function" || Cls.apiVersion !== av || Cls.kind !== kind) {
    res.errors.push("no such apiVersion/kind in Kubernetes: " + av + " " + kind);
    continue;
  }
  try { new Cls(doc).validate(); } catch (e) { res.errors.push(e.message); }
  const seen = new Map(), proxies = new Map();
  const note = (t, k) => { if (typeof k === "string") seen.get(t).add(k); };
  const wrap = (o) => {
    if (o === null || typeof o !== "object") return o;
    if (!proxies.has(o)) {
      seen.set(o, new Set());
      proxies.set(o, new Proxy(o, {
        get(t, k, r) { note(t, k); return wrap(Reflect.get(t, k, r)); },
        has(t, k) { note(t, k); return Reflect.has(t, k); },
        getOwnPropertyDescriptor(t, k) { note(t, k); return Reflect.getOwnPropertyDescriptor(t, k); },
      }));
    }
    return proxies.get(o);
  };
  try { Cls.prototype.validate.call(wrap(doc)); } catch (e) { }
  const walk = (o, p) => {
    if (Array.isArray(o)) { o.forEach((x, i) => walk(x, p + "/" + i)); return; }
    if (o === null || typeof o !== "object") return;
    const s = seen.get(o);
    for (const k of Object.keys(o)) {
      if (s && s.size && !s.has(k)) res.errors.push("data" + p + "/" + k + " is not a field of the schema");
      walk(o[k], p + "/" + k);
    }
  };
  walk(doc, "");
}
process.stdout.write(JSON.stringify(out));
