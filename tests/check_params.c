/*
 * check_params.c: unit tests for the typed parameter registry (src/param.c
 * and src/util/params.def): defaults, parsing of each type from the environment,
 * errors that name the bad variable, the tuning file between the defaults
 * and the environment, the registry's own consistency, and
 * that dcomm(7) documents every parameter.
 *
 * Each test runs in its own forked process, so it may change the
 * environment freely; every test starts by clearing all DCOMM_* variables.
 */
#include "config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcomm.h"
#include "error.h"
#include "param.h"
#include "world.h"

extern const struct dcomm_backend_v1 dcomm__backend_tcp;

/* Removes every registered variable from the environment. */
static void clear_env(void) {
  for (int id = 0; id < DCOMM_P_COUNT; id++) unsetenv(dcomm__param_info(id)->name);
}

/* Sets one variable and reloads; returns dcomm__params_load's result. */
static int load_with(const char *name, const char *value) {
  clear_env();
  ck_assert_int_eq(setenv(name, value, 1), 0);
  return dcomm__params_load();
}

START_TEST(test_defaults) {
  clear_env();
  ck_assert_int_eq(dcomm__params_load(), 0);
  ck_assert_str_eq(dcomm__param_str(DCOMM_P_BACKEND), "tcp");
  ck_assert_str_eq(dcomm__param_str(DCOMM_P_INIT_METHOD), "");
  ck_assert_str_eq(dcomm__param_str(DCOMM_P_LOG_LEVEL), "warn");
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 300.0);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT), 60.0);
  ck_assert_int_eq(dcomm__param_bool(DCOMM_P_USE_AGENT_STORE), 0);
  ck_assert_int_eq(dcomm__param_bool(DCOMM_P_CHECK_MISMATCH), 1);
  ck_assert_uint_eq(dcomm__param_size(DCOMM_P_STORE_MAX_VALUE), 67108864);
  /* The tcp backend's own parameters come from its table. */
  ck_assert_str_eq(dcomm__backend_param_default(&dcomm__backend_tcp, "DCOMM_TCP_CHUNK_SIZE"), "262144");
  ck_assert_str_eq(dcomm__backend_param_default(&dcomm__backend_tcp, "DCOMM_TCP_BUFSIZE"), "4194304");
  ck_assert_str_eq(dcomm__backend_param_default(&dcomm__backend_tcp, "DCOMM_ALGO"), "auto");
  ck_assert_ptr_null(dcomm__backend_param_default(&dcomm__backend_tcp, "DCOMM_TIMEOUT"));
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_BACKEND"), "tcp");
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_TIMEOUT"), "300");
}
END_TEST

/* The getters load on first use, without an explicit dcomm__params_load. */
START_TEST(test_lazy_load) {
  clear_env();
  setenv("DCOMM_TIMEOUT", "7", 1);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 7.0);
  ck_assert_str_eq(dcomm__param_str(DCOMM_P_BACKEND), "tcp");
}
END_TEST

/*
 * Every registered default must parse as its own type, and the value the
 * registry then serves must equal what the shared parser produces.
 */
START_TEST(test_registry_defaults_parse) {
  clear_env();
  ck_assert_int_eq(dcomm__params_load(), 0);
  for (int id = 0; id < DCOMM_P_COUNT; id++) {
    const struct dcomm_param_info *p = dcomm__param_info(id);
    long l;
    double d;
    int b;
    size_t z;
    switch (p->type) {
      case DCOMM_PT_STR: ck_assert_str_eq(dcomm__param_str((enum dcomm_param_id)id), p->def); break;
      case DCOMM_PT_INT:
        ck_assert_msg(dcomm__parse_long(p->def, &l) == 0, "%s default '%s' is not an integer", p->name, p->def);
        ck_assert_int_eq(dcomm__param_int((enum dcomm_param_id)id), l);
        break;
      case DCOMM_PT_DOUBLE:
        ck_assert_msg(dcomm__parse_double(p->def, &d) == 0 && d >= 0, "%s default '%s' is not a number", p->name,
                      p->def);
        ck_assert_double_eq(dcomm__param_double((enum dcomm_param_id)id), d);
        break;
      case DCOMM_PT_BOOL:
        ck_assert_msg(dcomm__parse_bool(p->def, &b) == 0, "%s default '%s' is not a boolean", p->name, p->def);
        ck_assert_int_eq(dcomm__param_bool((enum dcomm_param_id)id), b);
        break;
      case DCOMM_PT_SIZE:
        ck_assert_msg(dcomm__parse_size(p->def, &z) == 0, "%s default '%s' is not a size", p->name, p->def);
        ck_assert_uint_eq(dcomm__param_size((enum dcomm_param_id)id), z);
        break;
      default: ck_abort_msg("%s has an unknown type %d", p->name, (int)p->type);
    }
  }
}
END_TEST

START_TEST(test_registry_well_formed) {
  for (int id = 0; id < DCOMM_P_COUNT; id++) {
    const struct dcomm_param_info *p = dcomm__param_info(id);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(p->name);
    ck_assert_msg(strncmp(p->name, "DCOMM_", 6) == 0 && p->name[6] != '\0', "bad parameter name '%s'", p->name);
    ck_assert_msg(p->help != NULL && p->help[0] != '\0', "%s has no help text", p->name);
    ck_assert_msg(p->def != NULL, "%s has no default", p->name);
    ck_assert_msg(strcmp(dcomm__param_type_name(p->type), "?") != 0, "%s has an unknown type", p->name);
    for (int other = 0; other < id; other++)
      ck_assert_msg(strcmp(p->name, dcomm__param_info(other)->name) != 0, "%s is registered twice", p->name);
  }
  ck_assert_ptr_null(dcomm__param_info(-1));
  ck_assert_ptr_null(dcomm__param_info(DCOMM_P_COUNT));
  ck_assert_str_eq(dcomm__param_type_name(DCOMM_PT_STR), "string");
  ck_assert_str_eq(dcomm__param_type_name(DCOMM_PT_INT), "integer");
  ck_assert_str_eq(dcomm__param_type_name(DCOMM_PT_DOUBLE), "number");
  ck_assert_str_eq(dcomm__param_type_name(DCOMM_PT_BOOL), "boolean");
  ck_assert_str_eq(dcomm__param_type_name(DCOMM_PT_SIZE), "size");
}
END_TEST

START_TEST(test_env_string) {
  ck_assert_int_eq(load_with("DCOMM_BACKEND", "nccl"), 0);
  ck_assert_str_eq(dcomm__param_str(DCOMM_P_BACKEND), "nccl");
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_BACKEND"), "nccl");
  /* An empty string is a valid string value. */
  ck_assert_int_eq(load_with("DCOMM_LOG_LEVEL", ""), 0);
  ck_assert_str_eq(dcomm__param_str(DCOMM_P_LOG_LEVEL), "");
}
END_TEST

/*
 * No registered parameter is an integer today, so the integer path is
 * tested through its parser, and through the registry for any INT
 * parameter that params.def gains later.
 */
START_TEST(test_env_int) {
  long v = 0;
  ck_assert_int_eq(dcomm__parse_long("42", &v), 0);
  ck_assert_int_eq(v, 42);
  ck_assert_int_eq(dcomm__parse_long("-7", &v), 0);
  ck_assert_int_eq(v, -7);
  ck_assert_int_eq(dcomm__parse_long("0", &v), 0);
  ck_assert_int_eq(v, 0);
  ck_assert_int_eq(dcomm__parse_long("abc", &v), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__parse_long("", &v), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__parse_long("12x", &v), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__parse_long("1.5", &v), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__parse_long("99999999999999999999999", &v), DCOMM_EINVAL);
  for (int id = 0; id < DCOMM_P_COUNT; id++) {
    const struct dcomm_param_info *p = dcomm__param_info(id);
    if (p->type != DCOMM_PT_INT) continue;
    ck_assert_int_eq(load_with(p->name, "42"), 0);
    ck_assert_int_eq(dcomm__param_int((enum dcomm_param_id)id), 42);
    ck_assert_int_eq(load_with(p->name, "-3"), 0);
    ck_assert_int_eq(dcomm__param_int((enum dcomm_param_id)id), -3);
    ck_assert_int_eq(load_with(p->name, "abc"), DCOMM_EINVAL);
    ck_assert_ptr_nonnull(strstr(dcomm_last_error(), p->name));
  }
}
END_TEST

START_TEST(test_env_double) {
  ck_assert_int_eq(load_with("DCOMM_TIMEOUT", "12.5"), 0);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 12.5);
  ck_assert_int_eq(load_with("DCOMM_TIMEOUT", "1e2"), 0);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 100.0);
  ck_assert_int_eq(load_with("DCOMM_CONNECT_TIMEOUT", "0.25"), 0);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_CONNECT_TIMEOUT), 0.25);
  /* A timeout must be positive: 0 would fail every call at once. */
  ck_assert_int_eq(load_with("DCOMM_CONNECT_TIMEOUT", "0"), DCOMM_EINVAL);
  ck_assert_int_eq(load_with("DCOMM_TIMEOUT", "-1"), DCOMM_EINVAL);
  ck_assert_int_eq(load_with("DCOMM_TIMEOUT", "nan"), DCOMM_EINVAL);
  ck_assert_int_eq(load_with("DCOMM_TIMEOUT", "5s"), DCOMM_EINVAL);
  ck_assert_int_eq(load_with("DCOMM_TIMEOUT", ""), DCOMM_EINVAL);
}
END_TEST

/* Loop index: one spelling of a boolean each. */
static const struct {
  const char *text;
  int value;
} bools[] = {
    {"yes", 1}, {"no", 0}, {"1", 1}, {"0", 0}, {"true", 1}, {"false", 0},
    {"TRUE", 1}, {"No", 0}, {"on", 1}, {"off", 0},
};

START_TEST(test_env_bool) {
  ck_assert_int_eq(load_with("DCOMM_CHECK_MISMATCH", bools[_i].text), 0);
  ck_assert_int_eq(dcomm__param_bool(DCOMM_P_CHECK_MISMATCH), bools[_i].value);
  ck_assert_int_eq(load_with("DCOMM_USE_AGENT_STORE", bools[_i].text), 0);
  ck_assert_int_eq(dcomm__param_bool(DCOMM_P_USE_AGENT_STORE), bools[_i].value);
}
END_TEST

START_TEST(test_env_size) {
  static const struct {
    const char *text;
    size_t value;
  } sizes[] = {
      {"512", 512},
      {"0", 0},
      {"4K", 4096},
      {"4k", 4096},
      {"2M", 2u << 20},
      {"1G", (size_t)1 << 30},
      {"3G", (size_t)3 << 30},
      {"8KiB", 8192},
      {"16KB", 16384},
  };
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    ck_assert_msg(load_with("DCOMM_STORE_MAX_VALUE", sizes[i].text) == 0, "'%s' rejected", sizes[i].text);
    ck_assert_msg(dcomm__param_size(DCOMM_P_STORE_MAX_VALUE) == sizes[i].value, "'%s' gave %zu, want %zu",
                  sizes[i].text, dcomm__param_size(DCOMM_P_STORE_MAX_VALUE), sizes[i].value);
  }
  static const char *const bad[] = {"-1", "", "K", "1T", "12 ", "1.5M", "4Kx", "99999999999999999999999"};
  size_t z;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    ck_assert_msg(dcomm__parse_size(bad[i], &z) == DCOMM_EINVAL, "size '%s' accepted", bad[i]);
  ck_assert_int_eq(dcomm__parse_size("99999999999G", &z), DCOMM_EINVAL); /* overflows size_t */
}
END_TEST

START_TEST(test_parsers_bool_double) {
  int b = -1;
  double d = 0;
  ck_assert_int_eq(dcomm__parse_bool("maybe", &b), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__parse_bool("", &b), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__parse_bool("2", &b), DCOMM_EINVAL);
  ck_assert_int_eq(b, -1); /* untouched on error */
  ck_assert_int_eq(dcomm__parse_double("abc", &d), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__parse_double("", &d), DCOMM_EINVAL);
  ck_assert_int_eq(dcomm__parse_double("0.25", &d), 0);
  ck_assert_double_eq(d, 0.25);
}
END_TEST

/* Loop index: one bad value each; the error must name the variable. */
static const struct {
  const char *name, *value;
  enum dcomm_param_id id;
} bad_values[] = {
    {"DCOMM_TIMEOUT", "abc", DCOMM_P_TIMEOUT},
    {"DCOMM_STORE_MAX_VALUE", "-1", DCOMM_P_STORE_MAX_VALUE},
    {"DCOMM_CHECK_MISMATCH", "maybe", DCOMM_P_CHECK_MISMATCH},
};

START_TEST(test_bad_value) {
  const char *name = bad_values[_i].name, *value = bad_values[_i].value;
  dcomm__err_clear();
  ck_assert_int_eq(load_with(name, value), DCOMM_EINVAL);
  const char *msg = dcomm_last_error();
  ck_assert_msg(strstr(msg, name) != NULL, "error '%s' does not name %s", msg, name);
  ck_assert_msg(strstr(msg, value) != NULL, "error '%s' does not quote '%s'", msg, value);
  /* The bad variable falls back to its default. */
  const struct dcomm_param_info *p = dcomm__param_info(bad_values[_i].id);
  switch (p->type) {
    case DCOMM_PT_DOUBLE: ck_assert_double_eq(dcomm__param_double(bad_values[_i].id), strtod(p->def, NULL)); break;
    case DCOMM_PT_SIZE: ck_assert_uint_eq(dcomm__param_size(bad_values[_i].id), strtoull(p->def, NULL, 10)); break;
    case DCOMM_PT_BOOL: ck_assert_int_eq(dcomm__param_bool(bad_values[_i].id), strtol(p->def, NULL, 10)); break;
    default: break;
  }
}
END_TEST

/* A bad variable does not hide good ones set at the same time. */
START_TEST(test_bad_value_others_kept) {
  clear_env();
  setenv("DCOMM_TIMEOUT", "abc", 1);
  setenv("DCOMM_BACKEND", "nccl", 1);
  setenv("DCOMM_STORE_MAX_VALUE", "1M", 1);
  ck_assert_int_eq(dcomm__params_load(), DCOMM_EINVAL);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "DCOMM_TIMEOUT"));
  ck_assert_str_eq(dcomm__param_str(DCOMM_P_BACKEND), "nccl");
  ck_assert_uint_eq(dcomm__param_size(DCOMM_P_STORE_MAX_VALUE), 1u << 20);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 300.0);
  /* Fixing the variable makes the next load succeed. */
  setenv("DCOMM_TIMEOUT", "30", 1);
  ck_assert_int_eq(dcomm__params_load(), 0);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 30.0);
}
END_TEST

START_TEST(test_by_name) {
  clear_env();
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_CONTROL_PATH"), "auto");
  setenv("DCOMM_CONTROL_PATH", "store", 1);
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_CONTROL_PATH"), "store");
  /* A name outside the registry reads the plain environment. */
  unsetenv("DCOMM_NOT_A_PARAM");
  ck_assert_ptr_null(dcomm__param_by_name("DCOMM_NOT_A_PARAM"));
  setenv("DCOMM_NOT_A_PARAM", "x", 1);
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_NOT_A_PARAM"), "x");
}
END_TEST

static int backend_param_count(void) {
  int n = 0;
  while (dcomm__backend_tcp.params[n].name) n++;
  return n;
}

/*
 * The tcp backend declares its parameters in its table: well formed, each
 * default parses as its type, none also in the core's registry.
 */
START_TEST(test_backend_params) {
  int n = backend_param_count();
  ck_assert_int_ge(n, 10);
  for (int i = 0; i < n; i++) {
    const struct dcomm_backend_param *p = &dcomm__backend_tcp.params[i];
    ck_assert_msg(!strncmp(p->name, "DCOMM_", 6), "bad name %s", p->name);
    ck_assert_msg(p->help && *p->help && p->def, "%s lacks help or default", p->name);
    size_t z;
    int b;
    long l;
    if (!strcmp(p->type, "size")) ck_assert_msg(dcomm__parse_size(p->def, &z) == 0, "%s default '%s'", p->name, p->def);
    else if (!strcmp(p->type, "bool")) ck_assert_msg(dcomm__parse_bool(p->def, &b) == 0, "%s default '%s'", p->name, p->def);
    else if (!strcmp(p->type, "int")) ck_assert_msg(dcomm__parse_long(p->def, &l) == 0, "%s default '%s'", p->name, p->def);
    else ck_assert_msg(!strcmp(p->type, "str") || !strcmp(p->type, "double"), "%s type %s", p->name, p->type);
    for (int id = 0; id < DCOMM_P_COUNT; id++)
      ck_assert_msg(strcmp(p->name, dcomm__param_info(id)->name) != 0, "%s is declared by tcp and the core", p->name);
    for (int j = 0; j < i; j++) ck_assert_msg(strcmp(p->name, dcomm__backend_tcp.params[j].name), "%s twice", p->name);
  }
}
END_TEST

/*
 * Whether name occurs in text not as the start of a longer name (so that
 * DCOMM_TCP does not count for DCOMM_TCP_BUFSIZE). What comes before is not
 * checked, since roff puts font escapes such as \fB right before a word.
 */
static int has_name(const char *text, const char *name) {
  size_t n = strlen(name);
  for (const char *p = strstr(text, name); p; p = strstr(p + 1, name)) {
    char after = p[n];
    if (!((after >= 'A' && after <= 'Z') || (after >= '0' && after <= '9') || after == '_')) return 1;
  }
  return 0;
}

/*
 * dcomm(7) must mention every parameter. The path comes from DCOMM_MAN7,
 * else man/man7/dcomm.7 relative to the working directory (the tests run
 * from the top of the build tree, which is the source tree).
 */
START_TEST(test_man_page_lists_all) {
  const char *path = getenv("DCOMM_MAN7");
  if (!path || !*path) path = "man/man7/dcomm.7";
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "cannot open %s (set DCOMM_MAN7 to its path)", path);
  size_t cap = 1 << 16, len = 0;
  char *text = malloc(cap);
  ck_assert_ptr_nonnull(text);
  size_t got;
  while ((got = fread(text + len, 1, cap - len - 1, f)) > 0) {
    len += got;
    if (cap - len - 1 == 0) {
      cap *= 2;
      text = realloc(text, cap);
      ck_assert_ptr_nonnull(text);
    }
  }
  fclose(f);
  text[len] = '\0';
  char missing[2048] = "";
  int n_missing = 0;
  int total = DCOMM_P_COUNT + backend_param_count();
  for (int id = 0; id < total; id++) {
    const char *name = id < DCOMM_P_COUNT ? dcomm__param_info(id)->name : dcomm__backend_tcp.params[id - DCOMM_P_COUNT].name;
    if (has_name(text, name)) continue;
    n_missing++;
    if (strlen(missing) + strlen(name) + 2 < sizeof(missing)) {
      strcat(missing, " ");
      strcat(missing, name);
    }
  }
  free(text);
  ck_assert_msg(n_missing == 0, "%s does not document %d of %d parameters:%s", path, n_missing, total, missing);
}
END_TEST

/* Writes text to a fresh file and points DCOMM_TUNING_FILE at it. */
static void tuning_file(char *path, size_t n, const char *text) {
  snprintf(path, n, "/tmp/check_params_tuning.XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  setenv("DCOMM_TUNING_FILE", path, 1);
}

/* The tuning file's values stand between the defaults and the
 * environment, for the core's parameters and for a backend's. */
START_TEST(test_tuning_layers) {
  char path[64];
  clear_env();
  unsetenv("DCOMM_SHM_SPIN");
  tuning_file(path, sizeof(path),
              "# measured here\n\n  DCOMM_TIMEOUT = 42\nDCOMM_SHM_SPIN=7\nDCOMM_TCP_CHUNK_SIZE=1K\n"
              "DCOMM_TCP_CHUNK_SIZE=64K\n");
  ck_assert_int_eq(dcomm__params_load(), 0);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 42.0);
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_SHM_SPIN"), "7");         /* a backend's */
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_TCP_CHUNK_SIZE"), "64K"); /* a later line wins */
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_CONTROL_PATH"), "auto");  /* not in the file */
  setenv("DCOMM_TIMEOUT", "9", 1);
  setenv("DCOMM_SHM_SPIN", "3", 1);
  ck_assert_int_eq(dcomm__params_load(), 0);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 9.0); /* the environment wins */
  ck_assert_str_eq(dcomm__param_by_name("DCOMM_SHM_SPIN"), "3");
  /* none: no file, the defaults again */
  unsetenv("DCOMM_TIMEOUT");
  setenv("DCOMM_TUNING_FILE", "none", 1);
  ck_assert_int_eq(dcomm__params_load(), 0);
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 300.0);
  unlink(path);
}
END_TEST

/* A malformed file, a value its parameter cannot take and a named file
 * that is missing are errors naming the file (and the line), and leave
 * the defaults in force. */
START_TEST(test_tuning_errors) {
  char path[64];
  clear_env();
  tuning_file(path, sizeof(path), "DCOMM_TIMEOUT=42\nnot a setting\n");
  dcomm__err_clear();
  ck_assert_int_eq(dcomm__params_load(), DCOMM_EINVAL);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), path));
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "line 2"));
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 300.0);
  unlink(path);

  tuning_file(path, sizeof(path), "DCOMM_TIMEOUT=soon\n");
  ck_assert_int_eq(dcomm__params_load(), DCOMM_EINVAL);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "DCOMM_TIMEOUT='soon' in the tuning file"));
  ck_assert_double_eq(dcomm__param_double(DCOMM_P_TIMEOUT), 300.0);
  unlink(path);

  setenv("DCOMM_TUNING_FILE", "/nonexistent/dcomm-tuning.conf", 1);
  ck_assert_int_eq(dcomm__params_load(), DCOMM_ESYSTEM);
  ck_assert_ptr_nonnull(strstr(dcomm_last_error(), "/nonexistent/dcomm-tuning.conf (DCOMM_TUNING_FILE)"));
}
END_TEST

static Suite *params_suite(void) {
  Suite *s = suite_create("params");
  TCase *tc = tcase_create("registry");
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_lazy_load);
  tcase_add_test(tc, test_registry_defaults_parse);
  tcase_add_test(tc, test_registry_well_formed);
  tcase_add_test(tc, test_backend_params);
  tcase_add_test(tc, test_by_name);
  suite_add_tcase(s, tc);

  tc = tcase_create("env");
  tcase_add_test(tc, test_env_string);
  tcase_add_test(tc, test_env_int);
  tcase_add_test(tc, test_env_double);
  tcase_add_loop_test(tc, test_env_bool, 0, (int)(sizeof(bools) / sizeof(bools[0])));
  tcase_add_test(tc, test_env_size);
  tcase_add_test(tc, test_parsers_bool_double);
  tcase_add_loop_test(tc, test_bad_value, 0, (int)(sizeof(bad_values) / sizeof(bad_values[0])));
  tcase_add_test(tc, test_bad_value_others_kept);
  suite_add_tcase(s, tc);

  tc = tcase_create("tuning");
  tcase_add_test(tc, test_tuning_layers);
  tcase_add_test(tc, test_tuning_errors);
  suite_add_tcase(s, tc);

  tc = tcase_create("docs");
  tcase_add_test(tc, test_man_page_lists_all);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(params_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
