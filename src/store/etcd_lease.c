/*
 * etcd_lease.c: the lease calls of the etcd client (etcd_client.h): grant,
 * one keepalive (the gateway's keepalive stream, one request object in and
 * one line out) and revoke. A lease that is gone (expired or revoked) is
 * DCOMM_ENOTFOUND.
 */
#define _GNU_SOURCE
#include "config.h"
#include "etcd_internal.h"

#include "error.h"

#ifdef DCOMM_HAVE_ETCD

#include <inttypes.h>
#include <jansson.h>

int dcomm__etcd_lease_grant(struct dcomm_etcd *c, int64_t ttl, int64_t *id, int64_t *granted_ttl) {
  const char *what = "lease grant";
  if (!c || !id || ttl <= 0) return dcomm__err(DCOMM_EINVAL, "etcd lease grant: NULL argument or TTL <= 0");
  *id = 0;
  json_t *req = json_object();
  if (req && etcd__jset_i64(req, "TTL", ttl)) {
    json_decref(req);
    req = NULL;
  }
  json_t *resp;
  DCOMM_CHECK(etcd__call(c, what, "/v3/lease/grant", req, -1, CALL_IDEMPOTENT, &resp));
  int64_t lid = 0, t = 0;
  int rc = etcd__j_i64(resp, "ID", 1, &lid, what);
  if (rc == 0) rc = etcd__j_i64(resp, "TTL", 0, &t, what);
  json_t *err = json_object_get(resp, "error");
  if (rc == 0 && json_is_string(err) && json_string_length(err))
    rc = dcomm__err(DCOMM_EBACKEND, "etcd lease grant: %s", json_string_value(err));
  if (rc == 0 && (lid == 0 || t <= 0)) rc = etcd__proto(what, "no lease ID or TTL in the answer", NULL);
  json_decref(resp);
  if (rc < 0) return rc;
  *id = lid;
  if (granted_ttl) *granted_ttl = t;
  return 0;
}

int dcomm__etcd_lease_keepalive(struct dcomm_etcd *c, int64_t id, int64_t *ttl) {
  const char *what = "lease keepalive";
  if (ttl) *ttl = 0;
  if (!c || id == 0) return dcomm__err(DCOMM_EINVAL, "etcd lease keepalive: NULL client or lease 0");
  json_t *req = json_object();
  if (req && etcd__jset_i64(req, "ID", id)) {
    json_decref(req);
    req = NULL;
  }
  /* A stream on the gateway: one request object in, one line out. */
  json_t *resp;
  DCOMM_CHECK(etcd__call(c, what, "/v3/lease/keepalive", req, -1, CALL_IDEMPOTENT, &resp));
  json_t *r = json_object_get(resp, "result");
  int64_t t = 0, rid = 0;
  int rc = json_is_object(r) ? 0 : etcd__proto(what, "field 'result' is missing or not an object", NULL);
  if (rc == 0) rc = etcd__j_i64(r, "ID", 0, &rid, what);
  if (rc == 0) rc = etcd__j_i64(r, "TTL", 0, &t, what);
  json_decref(resp);
  if (rc < 0) return rc;
  if (rid != 0 && rid != id) return etcd__proto(what, "the answer is about another lease", NULL);
  if (t <= 0) return dcomm__err(DCOMM_ENOTFOUND, "etcd lease keepalive: lease %" PRId64 " is gone (expired or revoked)", id);
  if (ttl) *ttl = t;
  return 0;
}

int dcomm__etcd_lease_revoke(struct dcomm_etcd *c, int64_t id) {
  const char *what = "lease revoke";
  if (!c || id == 0) return dcomm__err(DCOMM_EINVAL, "etcd lease revoke: NULL client or lease 0");
  json_t *req = json_object();
  if (req && etcd__jset_i64(req, "ID", id)) {
    json_decref(req);
    req = NULL;
  }
  json_t *resp;
  DCOMM_CHECK(etcd__call(c, what, "/v3/lease/revoke", req, -1, CALL_IDEMPOTENT, &resp));
  json_decref(resp);
  return 0;
}

#else /* !DCOMM_HAVE_ETCD */

int dcomm__etcd_lease_grant(struct dcomm_etcd *c, int64_t ttl, int64_t *id, int64_t *granted_ttl) {
  (void)c, (void)ttl, (void)id, (void)granted_ttl;
  return NOTSUP();
}
int dcomm__etcd_lease_keepalive(struct dcomm_etcd *c, int64_t id, int64_t *ttl) {
  (void)c, (void)id, (void)ttl;
  return NOTSUP();
}
int dcomm__etcd_lease_revoke(struct dcomm_etcd *c, int64_t id) {
  (void)c, (void)id;
  return NOTSUP();
}

#endif
