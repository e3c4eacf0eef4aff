// The dashboard: sign-in, the hash router, and the life of a page (its polls and streams end
// when it is left, so a tab never holds more than the page it shows).
import { ApiError, session, signIn, signInProviders, signOut, Stream, whenSignedOut, whoAmI } from "./api.js";
import { errorBox, fill, h, message, refreshAges } from "./dom.js";
import { forgetPicks, jobsList } from "./jobs.js";

// The jobs list comes with the page; every other page's module is fetched the first time it
// is shown, so the first load stays small.
const lazy = (module, name) => async (...args) => (await import(module))[name](...args);
const ROUTES = [
  [/^jobs$/, jobsList],
  [/^jobs\/([^/]+)$/, lazy("./job.js", "jobPage")],
  [/^nodes$/, lazy("./cluster.js", "nodesPage")],
  [/^tenants$/, lazy("./cluster.js", "tenantsPage"), { admin: true }],
  [/^models$/, lazy("./models.js", "modelsList")],
  [/^models\/([^/]+)\/([^/]+)$/, lazy("./models.js", "modelPage")],
  [/^deployments$/, lazy("./serving.js", "deploymentsList")],
  [/^deployments\/([^/]+)$/, lazy("./serving.js", "deploymentPage")],
  [/^searches$/, lazy("./searches.js", "searchesList")],
  [/^searches\/([^/]+)$/, lazy("./searches.js", "searchPage")],
  [/^compare$/, lazy("./compare.js", "comparePage")],
  [/^logs$/, lazy("./logsearch.js", "logSearchPage")],
];

const $ = (id) => document.getElementById(id);
const main = $("main");
// What the browser tests reach: set by the page that offers it (see Page.hook).
window.__trainyard = {};

class Page {
  constructor(path, q) {
    this.path = path;
    this.q = q;
    this.root = h("section", { class: "page", "data-page": path.split("/")[0] });
    this.alive = true;
    this.cleanups = [];
  }

  title(text) {
    if (this.alive) document.title = `${text} · Trainyard`;
  }

  // Change the page's query (filters, cursors): a new history entry, so Back works.
  set(changes) {
    const q = new URLSearchParams(this.q);
    for (const [k, v] of Object.entries(changes)) {
      if (v == null || v === "") q.delete(k);
      else q.set(k, v);
    }
    const text = q.toString();
    location.hash = `#/${this.path}${text ? `?${text}` : ""}`;
  }

  // Run `fn`; show its error (the API's own message) in `el` instead of throwing. `keep`
  // leaves what `el` shows and puts the error above it, until a later run succeeds.
  async guard(el, fn, { keep = false, fatal = null, test = "error" } = {}) {
    try {
      await fn();
      if (keep && this.alive) el.querySelector(":scope > .error.stale")?.remove();
      return true;
    } catch (err) {
      if (!this.alive || err.name === "AbortError" || err.status === 401) return false;
      if (!(err instanceof ApiError)) console.error(err); // a bug here, not an answer to show
      if (fatal) fill(fatal, errorBox(err, test));
      else if (keep) {
        el.querySelector(":scope > .error.stale")?.remove();
        const box = errorBox(err, test);
        box.classList.add("stale");
        el.prepend(box);
      } else fill(el, errorBox(err, test));
      return false;
    }
  }

  // Every `ms` while the page lives, each run after the last has finished; skipped while the
  // tab is hidden, where nobody reads it.
  every(ms, fn) {
    let timer;
    const tick = async () => {
      if (!this.alive) return;
      if (!document.hidden) await fn();
      if (this.alive) timer = setTimeout(tick, ms);
    };
    timer = setTimeout(tick, ms);
    this.cleanups.push(() => clearTimeout(timer));
  }

  // At most one run of `fn` per `ms`, the last call always honoured (trailing).
  throttle(fn, ms) {
    let timer = null;
    let again = false;
    const run = async () => {
      again = false;
      await fn();
      timer = setTimeout(() => {
        timer = null;
        if (again && this.alive) call();
      }, ms);
    };
    const call = () => {
      if (!this.alive) return;
      if (timer) again = true;
      else {
        timer = true;
        run();
      }
    };
    this.cleanups.push(() => clearTimeout(timer));
    return call;
  }

  stream(url, options) {
    const stream = new Stream(url, options).open();
    this.cleanups.push(() => stream.close());
    return stream;
  }

  hook(name, fn) {
    window.__trainyard[name] = fn;
    this.cleanups.push(() => delete window.__trainyard[name]);
  }

  close() {
    this.alive = false;
    for (const fn of this.cleanups) fn();
  }
}

let current = null;

function route() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, search = ""] = raw.split("?");
  if (!path) {
    location.replace("#/jobs");
    return;
  }
  if (current) current.close();
  const page = new Page(path, new URLSearchParams(search));
  current = page;
  fill(main, page.root);
  for (const a of document.querySelectorAll("#nav a")) {
    const here = path === a.dataset.route || path.startsWith(`${a.dataset.route}/`);
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  for (const [pattern, render, rules] of ROUTES) {
    const match = pattern.exec(path);
    if (!match) continue;
    if (rules?.admin && !session.isAdmin) break;
    render(page, ...match.slice(1).map(decodeURIComponent)).catch((err) => {
      if (!(err instanceof ApiError)) console.error(err);
      if (page.alive && err.status !== 401) fill(page.root, errorBox(err));
    });
    return;
  }
  page.title("Not found");
  fill(page.root, h("h1", null, "Not found"), h("p", { class: "empty", "data-test": "not-found" }, "There is no such page here. ", h("a", { href: "#/jobs" }, "Back to the jobs.")));
}

function showSignIn(why) {
  if (current) current.close();
  current = null;
  document.body.classList.remove("signed-in");
  $("nav").hidden = true;
  $("who").hidden = true;
  document.title = "Sign in · Trainyard";
  const form = $("sign-in").content.cloneNode(true).firstElementChild;
  const note = form.querySelector("[data-test=sign-in-error]");
  if (why) note.textContent = why;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    note.textContent = "";
    try {
      await signIn(form.elements.token.value.trim());
      form.elements.token.value = "";
      signedIn();
    } catch (err) {
      note.textContent = err.status === 401 ? "That token is not valid (or was revoked)." : message(err);
      button.disabled = false;
    }
  });
  // Sign-in through the identity provider, when the operator configured one: the browser goes
  // to the provider and comes back signed in (controlplane/http/ui.py).
  const sso = form.querySelector("[data-test=oidc]");
  signInProviders().then(
    ({ oidc }) => {
      if (!oidc) return;
      const go = sso.querySelector("button");
      go.textContent = `Sign in with ${oidc.name}`;
      go.addEventListener("click", () => location.assign(oidc.url));
      sso.hidden = false;
    },
    // The token form works without it; the reason is in the browser's network log.
    () => {},
  );
  fill(main, form);
  form.elements.token.focus();
}

let expiry = null;

function signedIn() {
  document.body.classList.add("signed-in");
  $("nav").hidden = false;
  $("who").hidden = false;
  $("nav-tenants").hidden = !session.isAdmin;
  $("who-name").textContent = session.isAdmin ? "admin" : session.tenant;
  $("who-name").title = session.expiresAt ? `signed in until ${new Date(session.expiresAt).toLocaleString()}` : "";
  clearTimeout(expiry);
  if (session.expiresAt) {
    // A timer can fire only up to ~24 days ahead; sessions last hours.
    const left = Math.min(Date.parse(session.expiresAt) - Date.now() + 1000, 2 ** 31 - 1);
    const expired = (err) => err.status === 401 && showSignIn("Your session has expired: sign in again.");
    expiry = setTimeout(() => whoAmI().catch(expired), Math.max(left, 0));
  }
  route();
}

whenSignedOut(() => showSignIn("Your session has ended: sign in again."));

$("sign-out").addEventListener("click", async () => {
  // Whoever signs in next in this tab starts without the jobs picked on the list.
  forgetPicks();
  try {
    await signOut();
    showSignIn("Signed out.");
  } catch (err) {
    // 401: it had ended already. Otherwise the server never said it ended the session.
    showSignIn(err.status === 401 ? "Signed out." : `Signing out failed (${message(err)}): the session lasts until it expires.`);
  }
});

window.addEventListener("hashchange", () => {
  if (document.body.classList.contains("signed-in")) route();
});
setInterval(() => refreshAges(main), 15000);

whoAmI().then(signedIn, (err) => showSignIn(err.status === 401 ? "" : message(err)));
