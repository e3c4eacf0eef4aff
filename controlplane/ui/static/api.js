// The page's only way to the server: JSON requests with the session's cookie (and its CSRF
// token on anything that changes something), and event streams that resume without gaps or
// repeats.

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || `the server answered ${status}`);
    this.status = status;
    this.field = body && body.field;
    this.fields = body && body.fields;
  }
}

// The CSRF token lives only in memory: after a reload it is read again from GET /ui/session,
// which a script of another origin cannot read.
export const session = { csrf: null, tenant: null, isAdmin: false, expiresAt: null };

// Called with the error when the server says the session has ended (401): the app shows the
// sign-in form.
let onSignedOut = () => {};
export const whenSignedOut = (fn) => (onSignedOut = fn);

export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && session.csrf) headers["X-CSRF-Token"] = session.csrf;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
      signal,
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, { error: "the server cannot be reached; retrying helps once it is up" });
  }
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { error: text.slice(0, 200) };
  }
  if (!response.ok) {
    const err = new ApiError(response.status, data);
    if (response.status === 401 && path !== "/ui/session") onSignedOut(err);
    throw err;
  }
  return data;
}

export async function signIn(token) {
  const opened = await api("/ui/session", { method: "POST", body: { token } });
  session.csrf = opened.csrf;
  return whoAmI();
}

// The identity provider the operator configured ({oidc: {name, url}}, or {oidc: null}).
export const signInProviders = () => api("/ui/login");

export async function whoAmI() {
  const who = await api("/ui/session");
  Object.assign(session, {
    csrf: who.csrf,
    tenant: who.tenant,
    isAdmin: who.is_admin,
    expiresAt: who.expires_at,
  });
  return session;
}

export async function signOut() {
  try {
    await api("/ui/session", { method: "DELETE" });
  } finally {
    Object.assign(session, { csrf: null, tenant: null, isAdmin: false, expiresAt: null });
  }
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    for (const one of [v].flat()) if (one != null && one !== "") q.append(k, one);
  }
  const text = q.toString();
  return text ? `?${text}` : "";
}

const RETRY_MS = [1000, 2000, 5000, 10000, 30000];

// An SSE stream delivered exactly once: every message with an id at or below the last one
// handled is dropped, so a reconnect (the browser's own, which resends Last-Event-ID, or ours
// with ?after=) never shows a message twice, and, resuming right after the last one handled,
// never skips one. `ordered` handlers get messages with ids; `control` handlers get those
// without (a log's `end`), which must not be judged by the id the browser carries over.
export class Stream {
  constructor(url, { ordered = {}, control = {}, status = () => {}, after = 0 }) {
    this.url = url;
    this.ordered = ordered;
    this.control = control;
    this.status = status;
    this.after = after;
    this.source = null;
    this.closed = false;
    this.failures = 0;
    this.reconnects = 0;
    this.timer = null;
  }

  open() {
    if (this.closed) return this;
    const sep = this.url.includes("?") ? "&" : "?";
    const url = this.after ? `${this.url}${sep}after=${this.after}` : this.url;
    const source = new EventSource(url);
    this.source = source;
    this.status("connecting");
    source.onopen = () => {
      this.failures = 0;
      this.status("live");
    };
    source.onerror = () => {
      if (this.closed || source !== this.source) return;
      if (source.readyState === EventSource.CLOSED) this.retry();
      else this.status("reconnecting"); // the browser tries again by itself, with Last-Event-ID
    };
    for (const [name, handle] of Object.entries(this.ordered)) {
      source.addEventListener(name, (event) => {
        const id = Number(event.lastEventId);
        if (source !== this.source || !(id > this.after)) return;
        this.after = id;
        handle(JSON.parse(event.data), id, name);
      });
    }
    for (const [name, handle] of Object.entries(this.control)) {
      source.addEventListener(name, (event) => {
        if (source === this.source) handle(JSON.parse(event.data || "null"), name);
      });
    }
    return this;
  }

  // The server refused or dropped the stream for good (an error status, a restart): open it
  // again, after a pause that grows, from the last message handled.
  retry() {
    this.source.close();
    const wait = RETRY_MS[Math.min(this.failures, RETRY_MS.length - 1)];
    this.failures += 1;
    this.status("reconnecting");
    this.timer = setTimeout(() => {
      // A 401 here signs the page out instead of retrying forever.
      api("/ui/session").then(
        () => this.reopen(),
        (err) => {
          if (err.status !== 401) return this.reopen();
          this.close();
          onSignedOut(err);
        },
      );
    }, wait);
  }

  reopen() {
    if (this.closed) return;
    if (this.source) this.source.close();
    this.reconnects += 1;
    this.open();
  }

  close(final = "closed") {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.source) this.source.close();
    this.status(final);
  }
}
