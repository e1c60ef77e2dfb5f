/*
 * etcd_watch.c: the watch of the etcd client (etcd_client.h). Each watch
 * has a private curl handle driven by a multi handle, so that it can be
 * cancelled and bounded and runs beside the client's unary calls. The
 * gateway's stream is a sequence of '\n'-terminated JSON lines; each is
 * checked and its events handed to the caller in order. A broken stream is
 * resumed on the next endpoint from the last revision seen.
 */
#define _GNU_SOURCE
#include "config.h"
#include "etcd_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#ifdef DCOMM_HAVE_ETCD

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>

#include "clock.h"
#include "log.h"

/* Error bodies are only read for their message. */
#define MAX_ERR_BODY ((size_t)64 << 10)
/* How often a watch looks at its cancel flag and deadline. */
#define WATCH_SLICE_MS 50

struct wstate {
  const char *what;
  const char *url;
  dcomm_etcd_watch_fn fn;
  void *arg;
  CURL *h;
  /* per attempt */
  long http;
  int checked_status;
  struct buf line, errbody;
  size_t scanned;
  int created;
  int stream_code; /* an error line's gRPC code (0: none) */
  char stream_msg[300];
  /* outcome */
  int done; /* fn asked to stop */
  int rc;   /* < 0: a final error found while reading */
  int64_t next_rev;
};

static int watch_proto(struct wstate *ws, const char *msg, const char *line, size_t len) {
  ws->rc = dcomm__err(DCOMM_EPROTO, "etcd %s: %s: malformed stream line: %s (%.80s%s)", ws->url, ws->what, msg,
                      line, len > 80 ? "..." : "");
  return -1;
}

static int watch_event(struct wstate *ws, json_t *e, const char *line, size_t len) {
  if (!json_is_object(e)) return watch_proto(ws, "an event is not an object", line, len);
  json_t *t = json_object_get(e, "type");
  int type = DCOMM_ETCD_PUT; /* PUT is the zero value: left out */
  if (t) {
    if (!json_is_string(t)) return watch_proto(ws, "event type is not a string", line, len);
    if (strcmp(json_string_value(t), "DELETE") == 0) type = DCOMM_ETCD_DELETE;
    else if (strcmp(json_string_value(t), "PUT") != 0) return watch_proto(ws, "unknown event type", line, len);
  }
  struct dcomm_etcd_kv kv;
  int rc = etcd__j_kv(json_object_get(e, "kv"), &kv, ws->what);
  if (rc < 0) {
    ws->rc = dcomm__err_ctx(rc, "etcd %s: %s: event", ws->url, ws->what);
    return -1;
  }
  if (kv.mod_revision <= 0) {
    dcomm__etcd_kv_clear(&kv);
    return watch_proto(ws, "event without mod_revision", line, len);
  }
  struct dcomm_etcd_event ev = {type,        kv.key,           kv.klen,    kv.val,  kv.vlen,
                                kv.mod_revision, kv.create_revision, kv.version, kv.lease};
  if (kv.mod_revision + 1 > ws->next_rev) ws->next_rev = kv.mod_revision + 1;
  int stop = ws->fn(&ev, ws->arg);
  dcomm__etcd_kv_clear(&kv);
  if (stop) {
    ws->done = 1;
    return -1;
  }
  return 0;
}

/* One '\n'-terminated line of the stream. -1: stop reading. */
static int watch_line(struct wstate *ws, const char *s, size_t len) {
  while (len && (s[len - 1] == '\r' || s[len - 1] == ' ')) len--;
  if (!len) return 0;
  json_error_t jerr;
  json_t *j = json_loadb(s, len, 0, &jerr);
  if (!j) return watch_proto(ws, jerr.text, s, len);
  int ret = 0;
  if (!json_is_object(j)) {
    ret = watch_proto(ws, "not a JSON object", s, len);
    goto out;
  }
  int code;
  char msg[300];
  if (json_object_get(j, "error")) {
    if (etcd__parse_error_body(j, &code, msg, sizeof(msg)) < 0) {
      ret = watch_proto(ws, "unreadable error", s, len);
    } else {
      ws->stream_code = code ? code : 2;
      snprintf(ws->stream_msg, sizeof(ws->stream_msg), "%s", msg);
      ret = -1;
    }
    goto out;
  }
  json_t *r = json_object_get(j, "result");
  if (!json_is_object(r)) {
    ret = watch_proto(ws, "field 'result' is missing or not an object", s, len);
    goto out;
  }
  int created = 0, canceled = 0;
  int64_t hrev = 0, compact = 0;
  if (etcd__j_bool(r, "created", &created, ws->what) < 0 || etcd__j_bool(r, "canceled", &canceled, ws->what) < 0 ||
      etcd__j_header_rev(r, 0, &hrev, ws->what) < 0 || etcd__j_i64(r, "compact_revision", 0, &compact, ws->what) < 0) {
    ws->rc = dcomm__err_ctx(DCOMM_EPROTO, "etcd %s: %s", ws->url, ws->what);
    ret = -1;
    goto out;
  }
  if (!ws->created && !created) {
    ret = watch_proto(ws, "the first answer is not 'created'", s, len);
    goto out;
  }
  if (created) ws->created = 1;
  if (canceled) {
    if (compact > 0) {
      struct dcomm_etcd_event ev = {DCOMM_ETCD_COMPACTED, "", 0, "", 0, compact, 0, 0, 0};
      ws->fn(&ev, ws->arg);
      ws->rc = dcomm__err(DCOMM_ENOTFOUND, "etcd %s: %s from revision %" PRId64 ": compacted up to revision %" PRId64
                          "; read again and watch from the new revision", ws->url, ws->what, ws->next_rev, compact);
    } else {
      json_t *why = json_object_get(r, "cancel_reason");
      const char *reason = json_is_string(why) ? json_string_value(why) : "(no reason)";
      if (strstr(reason, "Unauthenticated")) {
        ws->stream_code = 16;
      } else if (strstr(reason, "user name is empty")) {
        ws->stream_code = 3;
      } else if (strstr(reason, "PermissionDenied") || strstr(reason, "permission denied")) {
        ws->stream_code = 7;
      } else {
        ws->rc = dcomm__err(DCOMM_EBACKEND, "etcd %s: %s: etcd cancelled the watch: %s", ws->url, ws->what, reason);
      }
      snprintf(ws->stream_msg, sizeof(ws->stream_msg), "%s", reason);
    }
    ret = -1;
    goto out;
  }
  json_t *evs = json_object_get(r, "events");
  if (evs) {
    if (!json_is_array(evs)) {
      ret = watch_proto(ws, "field 'events' is not an array", s, len);
      goto out;
    }
    for (size_t i = 0; i < json_array_size(evs); i++)
      if (watch_event(ws, json_array_get(evs, i), s, len) < 0) {
        ret = -1;
        goto out;
      }
  } else if (!created && hrev > 0 && hrev + 1 > ws->next_rev) {
    ws->next_rev = hrev + 1; /* progress notification: nothing up to hrev */
  }
out:
  json_decref(j);
  return ret;
}

static size_t watch_write(char *ptr, size_t size, size_t nmemb, void *ud) {
  struct wstate *ws = ud;
  size_t n = size * nmemb;
  if (!ws->checked_status) {
    curl_easy_getinfo(ws->h, CURLINFO_RESPONSE_CODE, &ws->http);
    ws->checked_status = 1;
  }
  if (ws->http != 200) {
    if (ws->errbody.len + n <= ws->errbody.max) etcd__buf_append(&ws->errbody, ptr, n);
    return n;
  }
  if (etcd__buf_append(&ws->line, ptr, n) < 0) {
    ws->rc = ws->line.overflow
                 ? dcomm__err(DCOMM_EPROTO, "etcd %s: %s: stream line longer than %zu bytes", ws->url, ws->what, MAX_BODY)
                 : dcomm__err(DCOMM_ENOMEM, "etcd %s: out of memory", ws->what);
    return 0;
  }
  size_t start = 0;
  for (size_t i = ws->scanned; i < ws->line.len; i++) {
    if (ws->line.p[i] != '\n') continue;
    int r = watch_line(ws, ws->line.p + start, i - start);
    start = i + 1;
    if (r < 0) return 0; /* aborts the transfer: the outcome is in ws */
  }
  memmove(ws->line.p, ws->line.p + start, ws->line.len - start);
  ws->line.len -= start;
  ws->line.p[ws->line.len] = 0;
  ws->scanned = ws->line.len;
  return n;
}

void dcomm__etcd_watch_cancel(int *cancel) {
  if (cancel) __atomic_store_n(cancel, 1, __ATOMIC_RELEASE);
}

static int cancelled(const int *cancel) { return cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE); }

int dcomm__etcd_watch(struct dcomm_etcd *c, const char *key, int prefix, int64_t start_revision, double timeout,
                      dcomm_etcd_watch_fn fn, void *arg, const int *cancel) {
  const char *what = "watch";
  if (!c || !key || (!prefix && !*key) || !fn) return dcomm__err(DCOMM_EINVAL, "etcd watch: NULL argument or empty key");
  if (isnan(timeout) || start_revision < 0) return dcomm__err(DCOMM_EINVAL, "etcd watch: NaN timeout or bad revision");
  double deadline = timeout < 0 ? INFINITY : dcomm__now() + timeout;
  struct wstate ws = {.what = what, .fn = fn, .arg = arg, .next_rev = start_revision};
  ws.line.max = MAX_BODY;
  ws.errbody.max = MAX_ERR_BODY;
  CURL *h = curl_easy_init();
  CURLM *m = curl_multi_init();
  int rc = 0, fails = 0, tried_in_round = 0, reauthed = 0;
  double backoff = 0.05;
  char last_msg[512] = "";
  char errbuf[CURL_ERROR_SIZE];
  if (!h || !m) {
    rc = dcomm__err(DCOMM_ENOMEM, "etcd watch: out of memory");
    goto out;
  }
  ws.h = h;
  for (;;) {
    /* The request: from the next revision not yet delivered. */
    json_t *cr = etcd__range_obj(key, prefix);
    if (cr && ws.next_rev > 0 && etcd__jset_i64(cr, "start_revision", ws.next_rev)) {
      json_decref(cr);
      cr = NULL;
    }
    if (cr && json_object_set_new(cr, "progress_notify", json_true())) {
      json_decref(cr);
      cr = NULL;
    }
    json_t *req = cr ? json_pack("{s:o}", "create_request", cr) : NULL;
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    pthread_mutex_lock(&c->mu);
    int idx = c->cur;
    char url[MAX_URL + 64];
    size_t bl = strlen(c->urls[idx]); /* at most MAX_URL */
    memcpy(url, c->urls[idx], bl);
    memcpy(url + bl, "/v3/watch", sizeof("/v3/watch"));
    char *token = c->token ? strdup(c->token) : NULL;
    int need_token = c->token != NULL;
    pthread_mutex_unlock(&c->mu);
    struct curl_slist *hdrs = etcd__make_headers(token);
    if (!body || !hdrs || (need_token && !token)) {
      free(body);
      free(token);
      curl_slist_free_all(hdrs);
      rc = dcomm__err(DCOMM_ENOMEM, "etcd watch: out of memory");
      goto out;
    }
    ws.url = c->urls[idx];
    ws.http = 0;
    ws.checked_status = 0;
    ws.line.len = 0;
    ws.errbody.len = 0;
    ws.scanned = 0;
    ws.created = 0;
    ws.stream_code = 0;
    etcd__set_common(c, h, url, body, strlen(body), hdrs, errbuf);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, watch_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &ws);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 0L); /* a stream: bounded below */
    double left = deadline - dcomm__now();
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, etcd__ms_of(left < c->timeout ? left : c->timeout));
    curl_multi_add_handle(m, h);
    double attempt_start = dcomm__now();
    int64_t rev_before = ws.next_rev;
    int running = 1, stopped_by_us = 0;
    CURLcode cc = CURLE_OK;
    while (running) {
      CURLMcode mc = curl_multi_perform(m, &running);
      if (mc != CURLM_OK) {
        cc = CURLE_FAILED_INIT;
        snprintf(errbuf, sizeof(errbuf), "curl_multi_perform: %s", curl_multi_strerror(mc));
        break;
      }
      if (!running || ws.done || ws.rc) break;
      if (cancelled(cancel) || dcomm__now() >= deadline) {
        stopped_by_us = 1;
        break;
      }
      double l = deadline - dcomm__now();
      int ms = l * 1000 < WATCH_SLICE_MS ? (int)(l * 1000) + 1 : WATCH_SLICE_MS;
      curl_multi_poll(m, NULL, 0, ms, NULL);
    }
    if (!running) {
      int q;
      CURLMsg *msg;
      while ((msg = curl_multi_info_read(m, &q)))
        if (msg->msg == CURLMSG_DONE && msg->easy_handle == h) cc = msg->data.result;
    }
    curl_multi_remove_handle(m, h);
    curl_slist_free_all(hdrs);
    free(body);
    /* Progress: events delivered, or a stream that stayed up a while. */
    int progressed = ws.created && (ws.next_rev != rev_before || dcomm__now() - attempt_start > 2.0);
    /* Outcomes, most final first. */
    if (ws.done) {
      rc = 0;
      free(token);
      goto out;
    }
    if (ws.rc) {
      rc = ws.rc;
      free(token);
      goto out;
    }
    if (stopped_by_us || cancelled(cancel) || dcomm__now() >= deadline) {
      if (cancelled(cancel))
        rc = dcomm__err(DCOMM_EREVOKED, "etcd watch on '%.200s': cancelled", key);
      else
        rc = dcomm__err(DCOMM_ETIMEDOUT, "etcd watch on '%.200s': nothing within %.3f s%s%.400s%s", key, timeout,
                        last_msg[0] ? " (last failure: " : "", last_msg, last_msg[0] ? ")" : "");
      free(token);
      goto out;
    }
    int code = ws.stream_code;
    char emsg[300];
    snprintf(emsg, sizeof(emsg), "%s", ws.stream_msg);
    if (ws.http != 0 && ws.http != 200) {
      json_error_t jerr;
      json_t *j = ws.errbody.len ? json_loadb(ws.errbody.p, ws.errbody.len, 0, &jerr) : NULL;
      if (!j || etcd__parse_error_body(j, &code, emsg, sizeof(emsg)) < 0) {
        code = (ws.http == 503 || ws.http == 502 || ws.http == 504) ? 14 : -1;
        snprintf(emsg, sizeof(emsg), "HTTP %ld without an etcd error (%.60s)", ws.http,
                 ws.errbody.len ? ws.errbody.p : "empty body");
      }
      json_decref(j);
      if (code == -1) {
        rc = dcomm__err(ws.http >= 500 ? DCOMM_EBACKEND : DCOMM_EPROTO, "etcd %s: %s: %s", ws.url, what, emsg);
        free(token);
        goto out;
      }
    }
    if (code && code != 14) {
      if (etcd__is_auth_missing(code, emsg) && c->user && !reauthed) {
        reauthed = 1;
        DCOMM_LOG(INFO, ETCD, "etcd %s: watch: token refused (%s); authenticating again", ws.url, emsg);
        pthread_mutex_lock(&c->mu);
        /* Another thread may have renewed it already. */
        if (!c->token || !token || strcmp(c->token, token) == 0) {
          free(c->token);
          c->token = NULL;
          rc = etcd__authenticate_locked(c, dcomm__now() + c->timeout);
        }
        pthread_mutex_unlock(&c->mu);
        free(token);
        if (rc < 0) goto out;
        continue;
      }
      rc = etcd__map_etcd_error(ws.url, what, ws.http ? ws.http : 200, code, emsg);
      free(token);
      goto out;
    }
    free(token);
    if (code == 14) {
      snprintf(last_msg, sizeof(last_msg), "%s: %s", ws.url, emsg);
    } else if (cc == CURLE_OK && ws.line.len > 0) {
      rc = dcomm__err(DCOMM_EPROTO, "etcd %s: %s: the stream ended in the middle of a line (%.60s)", ws.url, what,
                      ws.line.p);
      goto out;
    } else if (cc != CURLE_OK && etcd__classify_curl(cc) != F_RETRY) {
      rc = dcomm__err(etcd__classify_curl(cc) == F_TLS ? DCOMM_EAUTH : DCOMM_EPROTO, "etcd %s: %s: %s", ws.url, what,
                      errbuf[0] ? errbuf : curl_easy_strerror(cc));
      goto out;
    } else {
      snprintf(last_msg, sizeof(last_msg), "%s: %s%s", ws.url,
               cc == CURLE_OK ? "the stream ended" : (errbuf[0] ? errbuf : curl_easy_strerror(cc)),
               ws.line.len ? " (cut in the middle of a line)" : "");
    }
    /* Lost or refused: resume on the next endpoint. */
    if (progressed) fails = 0, tried_in_round = 0, backoff = 0.05;
    fails++;
    tried_in_round++;
    if (fails > 2 * c->n + 1) {
      rc = dcomm__err(DCOMM_EPEERLOST, "etcd %s on '%.200s': no endpoint kept the stream (%d attempts; last: %s)", what,
                      key, fails, last_msg);
      goto out;
    }
    pthread_mutex_lock(&c->mu);
    if (c->cur == idx && c->n > 1) c->cur = (idx + 1) % c->n;
    DCOMM_LOG(INFO, ETCD, "etcd watch on '%.200s' lost (%s); resuming from revision %" PRId64 " on %s", key, last_msg,
              ws.next_rev, c->urls[c->cur]);
    pthread_mutex_unlock(&c->mu);
    if (tried_in_round >= c->n) {
      tried_in_round = 0;
      double until = dcomm__now() + backoff;
      while (dcomm__now() < until && dcomm__now() < deadline && !cancelled(cancel)) etcd__sleep_s(0.01);
      backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
    }
  }
out:
  if (m) curl_multi_cleanup(m);
  if (h) curl_easy_cleanup(h);
  etcd__buf_free(&ws.line);
  etcd__buf_free(&ws.errbody);
  return rc;
}

#else /* !DCOMM_HAVE_ETCD */

int dcomm__etcd_watch(struct dcomm_etcd *c, const char *key, int prefix, int64_t start_revision, double timeout,
                      dcomm_etcd_watch_fn fn, void *arg, const int *cancel) {
  (void)c, (void)key, (void)prefix, (void)start_revision, (void)timeout, (void)fn, (void)arg, (void)cancel;
  return NOTSUP();
}
void dcomm__etcd_watch_cancel(int *cancel) {
  if (cancel) *cancel = 1;
}

#endif
