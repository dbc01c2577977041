/*
 * mpengine.c: the `mpengine` command, a Lua 5.4 host modelled on lua.c.
 *
 * It links the C half of the `mp` module in (package.preload["mp.core"]),
 * points package.path at the Lua half found beside the executable, loads
 * `mp` as a global, applies --device, then runs -e/-l options, a script,
 * standard input, or a REPL: readline with a history file, Tab completion
 * of names and fields, auto-print of expressions, multi-line input, and
 * Ctrl-C that stops running code (or drops the input being typed) without
 * ending the process.
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "lua/lcore.h"
#include "engine/dist.h"

#ifndef MP_VERSION
#define MP_VERSION "unknown"
#endif

#define PROMPT      "mp> "
#define PROMPT2     "..> "
#define EOFMARK     "<eof>"
#define MARKLEN     (sizeof(EOFMARK) - 1)
#define LUA_VDIR    LUA_VERSION_MAJOR "." LUA_VERSION_MINOR
#define INIT_VAR    "LUA_INIT"
#define INIT_VARV   INIT_VAR "_" LUA_VERSION_MAJOR "_" LUA_VERSION_MINOR
#define HIST_MAX    1000
#define SLOW_SECS   0.1 /* REPL commands slower than this report their time */

/* loadline results besides Lua status codes */
#define LINE_EOF  (-1)
#define LINE_INTR (-2)

/* bits returned by collectargs */
#define has_error 1
#define has_i     2
#define has_v     4
#define has_e     8
#define has_E     16
#define has_help  32

static const char *progname = "mpengine";
static const char *device = NULL;
static lua_State *globalL = NULL;
static int interactive = 0;
static int use_readline = 0;
static char *histfile = NULL;
static volatile sig_atomic_t got_sigint = 0;
static volatile sig_atomic_t got_winch = 0;

/* ---------------------------------------------------------------- signals */

/* flags: SA_RESTART, so that running C code never sees EINTR, except where
   the REPL's plain reader must be woken by Ctrl-C */
static void setsignal(int sig, void (*handler)(int), int flags,
                      struct sigaction *old) {
  struct sigaction sa;
  sa.sa_handler = handler;
  sa.sa_flags = flags;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, old);
}

static void lstop(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}

/*
 * Ctrl-C while Lua runs: stop at the next hook. Outside the REPL a second
 * Ctrl-C (code stuck in C) gets the default action; in the REPL it only
 * re-arms the hook, so a session is never lost to an impatient key.
 */
static void laction(int sig) {
  int flag = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT;
  if (!interactive) setsignal(sig, SIG_DFL, 0, NULL);
  lua_sethook(globalL, lstop, flag, 1);
}

static void on_sigint(int sig) { (void)sig; got_sigint = 1; }
static void on_winch(int sig) { (void)sig; got_winch = 1; }

/* --------------------------------------------------------------- messages */

static void print_usage(FILE *f) {
  fprintf(f,
    "usage: %s [options] [script [args]]\n"
    "Available options are:\n"
    "  -e stat          execute string 'stat'\n"
    "  -i               enter interactive mode after executing 'script'\n"
    "  -l mod           require library 'mod' into global 'mod'\n"
    "  -l g=mod         require library 'mod' into global 'g'\n"
    "  -v, --version    show version information\n"
    "  -E               ignore environment variables (LUA_INIT, LUA_PATH...)\n"
    "  -W               turn warnings on\n"
    "  --device NAME    default device for new tensors: cpu, cuda\n"
    "                   (also --device=NAME)\n"
    "  --help           show this help\n"
    "  --               stop handling options\n"
    "  -                stop handling options and execute stdin\n"
    "The module 'mp' is loaded into the global 'mp' before anything runs.\n"
    "With no script: a REPL when stdin is a terminal, else stdin runs as a\n"
    "script. REPL history: $MPENGINE_HISTORY, else ~/.mpengine_history.\n",
    progname);
  fflush(f);
}

static int needs_arg(const char *opt) {
  return ((opt[1] == 'e' || opt[1] == 'l') && opt[2] == '\0') ||
         strcmp(opt, "--device") == 0 || strcmp(opt, "--device=") == 0;
}

static void print_badoption(const char *opt) {
  if (needs_arg(opt))
    fprintf(stderr, "%s: '%s' needs an argument\n", progname, opt);
  else
    fprintf(stderr, "%s: unrecognized option '%s'\n", progname, opt);
  print_usage(stderr);
}

static void l_message(const char *pname, const char *msg) {
  if (pname) fprintf(stderr, "%s: ", pname);
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
}

static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    l_message(progname, msg ? msg : "(error object is not a string)");
    lua_pop(L, 1);
  }
  return status;
}

static void print_version(void) {
  printf("mpengine %s (%s)\n", MP_VERSION, LUA_RELEASE);
  fflush(stdout);
}

/* ---------------------------------------------------------------- calling */

static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)",
                          luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static int docall(lua_State *L, int narg, int nres) {
  struct sigaction old;
  int status, base = lua_gettop(L) - narg;
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  globalL = L;
  setsignal(SIGINT, laction, SA_RESTART, &old);
  status = lua_pcall(L, narg, nres, base);
  sigaction(SIGINT, &old, NULL);
  /* a Ctrl-C that came too late to stop this call must not stop the next */
  if (lua_gethook(L) == lstop) lua_sethook(L, NULL, 0, 0);
  lua_remove(L, base);
  return status;
}

static int dochunk(lua_State *L, int status) {
  if (status == LUA_OK) status = docall(L, 0, 0);
  return report(L, status);
}

static int dofile(lua_State *L, const char *name) {
  return dochunk(L, luaL_loadfile(L, name));
}

static int dostring(lua_State *L, const char *s, const char *name) {
  return dochunk(L, luaL_loadbuffer(L, s, strlen(s), name));
}

/* "-l mod" sets global mod; "-l g=mod" sets global g */
static int dolibrary(lua_State *L, const char *spec) {
  const char *eq = strchr(spec, '=');
  const char *modname = eq ? eq + 1 : spec;
  int status;
  lua_getglobal(L, "require");
  lua_pushstring(L, modname);
  status = docall(L, 1, 1);
  if (status == LUA_OK) {
    if (eq) lua_pushlstring(L, spec, (size_t)(eq - spec));
    else lua_pushstring(L, spec);
    lua_insert(L, -2);
    lua_setglobal(L, lua_tostring(L, -2));
    lua_pop(L, 1);
  }
  return report(L, status);
}

static int pushargs(lua_State *L) {
  int i, n;
  if (lua_getglobal(L, "arg") != LUA_TTABLE)
    luaL_error(L, "'arg' is not a table");
  n = (int)luaL_len(L, -1);
  luaL_checkstack(L, n + 3, "too many arguments to script");
  for (i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
  lua_remove(L, -i);
  return n;
}

static int handle_script(lua_State *L, char **argv) {
  const char *fname = argv[0];
  int status;
  if (strcmp(fname, "-") == 0 && strcmp(argv[-1], "--") != 0)
    fname = NULL; /* stdin */
  status = luaL_loadfile(L, fname);
  if (status == LUA_OK) {
    int n = pushargs(L);
    status = docall(L, n, 0);
  }
  return report(L, status);
}

/* ---------------------------------------------------------------- options */

/*
 * Checks the options; returns their bits, or has_error with *first at the
 * bad option. *first ends at the script (argc if none). -e/-l/-W run later,
 * in order, from runargs.
 */
static int collectargs(int argc, char **argv, int *first) {
  int args = 0, i;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    *first = i;
    if (a[0] != '-') return args;
    if (a[1] == '-') {
      if (a[2] == '\0') { *first = i + 1; return args; }
      if (strcmp(a, "--help") == 0) args |= has_help;
      else if (strcmp(a, "--version") == 0) args |= has_v;
      else if (strncmp(a, "--device=", 9) == 0 && a[9] != '\0') device = a + 9;
      else if (strcmp(a, "--device") == 0 && i + 1 < argc && argv[i + 1][0] != '-')
        device = argv[++i];
      else return has_error;
      continue;
    }
    switch (a[1]) {
      case '\0': return args; /* '-' is the script: stdin */
      case 'E': case 'W': case 'i': case 'v':
        if (a[2] != '\0') return has_error;
        args |= a[1] == 'E' ? has_E : a[1] == 'i' ? has_i : a[1] == 'v' ? has_v : 0;
        break;
      case 'e':
        args |= has_e; /* FALLTHROUGH */
      case 'l':
        if (a[2] == '\0' && (++i >= argc || argv[i][0] == '-')) return has_error;
        break;
      default:
        return has_error;
    }
  }
  *first = argc;
  return args;
}

static int runargs(lua_State *L, char **argv, int n) {
  int i;
  for (i = 1; i < n; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--device") == 0) { i++; continue; }
    if (a[1] == 'e' || a[1] == 'l') {
      const char *extra = a[2] ? a + 2 : argv[++i];
      int status = a[1] == 'e' ? dostring(L, extra, "=(command line)")
                                : dolibrary(L, extra);
      if (status != LUA_OK) return 0;
    } else if (a[1] == 'W') {
      lua_warning(L, "@on", 0);
    }
  }
  return 1;
}

/* arg[0] is the script (or the program when there is none), as in lua */
static void createargtable(lua_State *L, char **argv, int argc, int script) {
  int i, narg;
  if (script == argc) script = 0;
  narg = argc - (script + 1);
  lua_createtable(L, narg > 0 ? narg : 0, script + 1);
  for (i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int handle_luainit(lua_State *L) {
  const char *name = "=" INIT_VARV;
  const char *init = getenv(name + 1);
  if (init == NULL) {
    name = "=" INIT_VAR;
    init = getenv(name + 1);
  }
  if (init == NULL) return LUA_OK;
  if (init[0] == '@') return dofile(L, init + 1);
  return dostring(L, init, name);
}

/* ----------------------------------------------------------------- the mp */

/*
 * The Lua files of `mp` live beside the executable: <exedir>/../lua in the
 * build tree, <exedir>/../share/lua/5.4 once installed. They go in front of
 * package.path so that a stale installed copy never shadows them.
 */
static void setup_package(lua_State *L) {
  static const char *const subdirs[] = {"../lua", "../share/lua/" LUA_VDIR};
  char exe[PATH_MAX], dir[PATH_MAX + 32], real[PATH_MAX];
  struct stat st;
  int n = 0;
  size_t i;
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  char *slash;
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_mp_core);
  lua_setfield(L, -2, "mp.core");
  lua_pop(L, 1);
  if (len <= 0) return;
  exe[len] = '\0';
  if ((slash = strrchr(exe, '/')) == NULL) return;
  *slash = '\0';
  lua_getglobal(L, "package");
  for (i = 0; i < sizeof subdirs / sizeof subdirs[0]; i++) {
    snprintf(dir, sizeof dir, "%s/%s", exe, subdirs[i]);
    if (realpath(dir, real) && stat(real, &st) == 0 && S_ISDIR(st.st_mode)) {
      lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", real, real);
      n++;
    }
  }
  lua_getfield(L, -1 - n, "path");
  lua_concat(L, n + 1);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
}

/* errors from set_default_device are the user's, so no traceback */
static int setdevice(lua_State *L, const char *name) {
  if (lua_getglobal(L, "mp") != LUA_TTABLE ||
      lua_getfield(L, -1, "set_default_device") != LUA_TFUNCTION) {
    l_message(progname, "--device: mp.set_default_device is missing");
    return LUA_ERRRUN;
  }
  lua_remove(L, -2);
  lua_pushstring(L, name);
  return report(L, lua_pcall(L, 1, 0, 0));
}

/* ------------------------------------------------------------ line input */

/* Tab completion: "mp.te" offers the keys of mp (and of its metatable's
   __index tables, which is where tensor methods live) starting with "te". */
static char **cands = NULL;
static size_t ncands = 0, capcands = 0;

static void addcand(const char *head, size_t hlen, const char *key) {
  size_t klen = strlen(key);
  char *s;
  if (ncands == capcands) {
    size_t cap = capcands ? 2 * capcands : 64;
    char **p = realloc(cands, cap * sizeof *p);
    if (p == NULL) return;
    cands = p;
    capcands = cap;
  }
  if ((s = malloc(hlen + klen + 1)) == NULL) return;
  memcpy(s, head, hlen);
  memcpy(s + hlen, key, klen + 1);
  cands[ncands++] = s;
}

static int isident(const char *s) {
  if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
    return 0;
  for (s++; *s; s++)
    if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
          (*s >= '0' && *s <= '9')))
      return 0;
  return 1;
}

/*
 * Replaces the value on top by its metatable's __index table. A C __index
 * (tensors: methods first, then properties) is seen through its first
 * upvalue when that is a table.
 */
static int next_index(lua_State *L) {
  if (!lua_getmetatable(L, -1)) return 0;
  lua_pushliteral(L, "__index");
  lua_rawget(L, -2);
  lua_remove(L, -2);
  lua_remove(L, -2);
  if (lua_iscfunction(L, -1) && lua_getupvalue(L, -1, 1) != NULL)
    lua_remove(L, -2);
  if (lua_istable(L, -1)) return 1;
  lua_pop(L, 1);
  lua_pushnil(L);
  return 0;
}

/* field lookup without running any metamethod code */
static void rawfield(lua_State *L, const char *key, size_t klen) {
  int depth;
  for (depth = 0; depth < 8; depth++) {
    if (lua_istable(L, -1)) {
      lua_pushlstring(L, key, klen);
      if (lua_rawget(L, -2) != LUA_TNIL) { lua_remove(L, -2); return; }
      lua_pop(L, 1);
    }
    if (!next_index(L)) break;
  }
  lua_pop(L, 1);
  lua_pushnil(L);
}

static void collect(lua_State *L, const char *text) {
  const char *sep = strpbrk(text, ".:"), *last = NULL, *p, *word;
  int depth;
  for (p = sep; p; p = strpbrk(p + 1, ".:")) last = p;
  word = last ? last + 1 : text;
  lua_pushglobaltable(L);
  for (p = text; last && p <= last; ) {
    size_t n = strcspn(p, ".:");
    if (n == 0) { lua_pop(L, 1); return; }
    rawfield(L, p, n);
    p += n + 1;
  }
  for (depth = 0; depth < 8; depth++) {
    if (lua_istable(L, -1)) {
      lua_pushnil(L);
      while (lua_next(L, -2)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) == LUA_TSTRING) {
          const char *k = lua_tostring(L, -1);
          if (strncmp(k, word, strlen(word)) == 0 && isident(k))
            addcand(text, (size_t)(word - text), k);
        }
      }
    }
    if (!next_index(L)) break;
  }
  lua_pop(L, 1);
}

static char *cand_gen(const char *text, int state) {
  static size_t i;
  (void)text;
  if (state == 0) i = 0;
  return i < ncands ? strdup(cands[i++]) : NULL;
}

static char **complete(const char *text, int start, int end) {
  size_t i;
  (void)start; (void)end;
  rl_attempted_completion_over = 1; /* never fall back to file names */
  rl_completion_append_character = '\0';
  for (i = 0; i < ncands; i++) free(cands[i]);
  ncands = 0;
  if (globalL && lua_checkstack(globalL, 10)) {
    int top = lua_gettop(globalL);
    collect(globalL, text);
    lua_settop(globalL, top);
  }
  return ncands ? rl_completion_matches(text, cand_gen) : NULL;
}

static void history_open(void) {
  const char *env = getenv("MPENGINE_HISTORY"), *home = getenv("HOME");
  int fd;
  if (env) {
    if (*env) histfile = strdup(env);
  } else if (home && *home) {
    if ((histfile = malloc(strlen(home) + 20)) != NULL)
      sprintf(histfile, "%s/.mpengine_history", home);
  }
  if (histfile == NULL) return;
  /* append_history needs the file to exist; no file, no history on disk */
  if ((fd = open(histfile, O_WRONLY | O_CREAT | O_APPEND, 0600)) < 0) {
    free(histfile);
    histfile = NULL;
    return;
  }
  close(fd);
  read_history(histfile);
  history_truncate_file(histfile, HIST_MAX);
}

static void saveline(const char *line) {
  if (!use_readline || line[0] == '\0') return;
  add_history(line);
  if (histfile) append_history(1, histfile);
}

static void repl_init(void) {
  use_readline = isatty(STDIN_FILENO);
  if (!use_readline) return;
  rl_readline_name = "mpengine";
  rl_instream = stdin;
  rl_outstream = stdout;
  rl_catch_signals = 0; /* SIGINT and SIGWINCH are ours, see readline_tty */
  rl_catch_sigwinch = 0;
  rl_basic_word_break_characters = " \t\n\"'`<>=;+-*/%^~#&|{}()[],";
  rl_attempted_completion_function = complete;
  using_history();
  history_open();
}

/*
 * readline in callback mode, waiting in pselect with SIGINT unblocked only
 * there: a Ctrl-C drops the line being typed and returns LINE_INTR, where
 * plain readline would re-raise SIGINT and end the process.
 */
static char *tty_line;
static int tty_ready;

static void on_line(char *line) {
  tty_line = line;
  tty_ready = 1;
  rl_callback_handler_remove();
}

static int readline_tty(const char *prompt, char **line) {
  int fd = fileno(rl_instream), r = 1;
  sigset_t block, orig;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGWINCH);
  sigprocmask(SIG_BLOCK, &block, &orig);
  got_sigint = 0;
  tty_ready = 0;
  tty_line = NULL;
  if (got_winch) { /* resized while code ran */
    got_winch = 0;
    rl_reset_screen_size();
  }
  rl_callback_handler_install(prompt, on_line);
  while (!tty_ready) {
    fd_set fds;
    int n;
    FD_ZERO(&fds);
    FD_SET(fd, &fds);
    n = pselect(fd + 1, &fds, NULL, NULL, NULL, &orig);
    if (got_sigint) {
      rl_free_line_state();
      rl_callback_sigcleanup();
      rl_echo_signal_char(SIGINT);
      rl_callback_handler_remove();
      fputc('\n', stdout);
      r = -1;
      break;
    }
    if (got_winch) { got_winch = 0; rl_resize_terminal(); }
    if (n > 0) rl_callback_read_char();
    else if (n < 0 && errno != EINTR) { rl_callback_handler_remove(); break; }
  }
  sigprocmask(SIG_SETMASK, &orig, NULL);
  if (r > 0 && tty_line == NULL) { fputc('\n', stdout); r = 0; }
  *line = tty_line;
  return r;
}

static int readline_plain(const char *prompt, char **line) {
  size_t cap = 0;
  char *buf = NULL;
  fputs(prompt, stdout);
  fflush(stdout);
  got_sigint = 0;
  if (getline(&buf, &cap, stdin) < 0) {
    int intr = errno == EINTR && got_sigint;
    free(buf);
    clearerr(stdin);
    fputc('\n', stdout);
    return intr ? -1 : 0;
  }
  *line = buf;
  return 1;
}

/* ------------------------------------------------------------------ REPL */

/* Every read the REPL makes of the user's state (_PROMPT, mp.pretty, print,
   the global table itself) runs protected: a global table whose __index
   raises, a _PROMPT whose __tostring does, or a `print` that is not a
   function makes an error message, and the REPL goes on. */

/* a protected call's error as text, whatever the error value is */
static const char *errtext(lua_State *L) {
  const char *msg = lua_tostring(L, -1);
  return msg ? msg : lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, -1));
}

static int prompt_k(lua_State *L) {
  int firstline = lua_toboolean(L, 1);
  if (lua_getglobal(L, firstline ? "_PROMPT" : "_PROMPT2") == LUA_TNIL)
    lua_pushstring(L, firstline ? PROMPT : PROMPT2);
  else
    luaL_tolstring(L, -1, NULL);
  return 1;
}

/* leaves the prompt on the stack */
static const char *get_prompt(lua_State *L, int firstline) {
  int top = lua_gettop(L);
  lua_pushcfunction(L, prompt_k);
  lua_pushboolean(L, firstline);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    l_message(progname, lua_pushfstring(L, "error reading _PROMPT (%s)", errtext(L)));
    lua_settop(L, top);
    lua_pushstring(L, firstline ? PROMPT : PROMPT2);
  }
  return lua_tostring(L, -1);
}

/* 1: a line pushed; 0: end of input; -1: interrupted */
static int pushline(lua_State *L, int firstline) {
  const char *prompt = get_prompt(L, firstline);
  char *b = NULL;
  size_t l;
  int r = use_readline ? readline_tty(prompt, &b) : readline_plain(prompt, &b);
  lua_pop(L, 1); /* prompt */
  if (r <= 0) return r;
  l = strlen(b);
  if (l > 0 && b[l - 1] == '\n') b[--l] = '\0';
  if (firstline && b[0] == '=') /* Lua 5.1 habit: "=expr" */
    lua_pushfstring(L, "return %s", b + 1);
  else
    lua_pushlstring(L, b, l);
  free(b);
  return 1;
}

static int addreturn(lua_State *L) {
  const char *line = lua_tostring(L, -1);
  const char *retline = lua_pushfstring(L, "return %s;", line);
  int status = luaL_loadbuffer(L, retline, strlen(retline), "=stdin");
  if (status == LUA_OK) {
    lua_remove(L, -2);
    saveline(line);
  } else {
    lua_pop(L, 2);
  }
  return status;
}

static int incomplete(lua_State *L, int status) {
  if (status == LUA_ERRSYNTAX) {
    size_t lmsg;
    const char *msg = lua_tolstring(L, -1, &lmsg);
    return lmsg >= MARKLEN && strcmp(msg + lmsg - MARKLEN, EOFMARK) == 0;
  }
  return 0;
}

/* reads continuation lines while the chunk so far ends too early */
static int multiline(lua_State *L) {
  for (;;) {
    size_t len;
    const char *line = lua_tolstring(L, 1, &len);
    int r, status = luaL_loadbuffer(L, line, len, "=stdin");
    if (!incomplete(L, status)) {
      saveline(line);
      return status;
    }
    if ((r = pushline(L, 0)) == 0) { /* input ended mid-chunk: report it */
      saveline(line);
      return status;
    }
    if (r < 0) return LINE_INTR;
    lua_remove(L, -2); /* the "<eof>" message */
    lua_pushliteral(L, "\n");
    lua_insert(L, -2);
    lua_concat(L, 3);
  }
}

static int loadline(lua_State *L) {
  int r, status;
  lua_settop(L, 0);
  if ((r = pushline(L, 1)) <= 0) return r == 0 ? LINE_EOF : LINE_INTR;
  if ((status = addreturn(L)) != LUA_OK) status = multiline(L);
  if (status == LINE_INTR) return status;
  lua_remove(L, 1);
  return status;
}

/* plain tables print through mp.pretty (keys and values, not an address);
   runs inside print_k's protected call */
static void prettify(lua_State *L, int n) {
  if (lua_getglobal(L, "mp") != LUA_TTABLE || lua_getfield(L, -1, "pretty") != LUA_TFUNCTION) {
    lua_settop(L, n);
    return;
  }
  for (int i = 1; i <= n; i++) {
    if (lua_type(L, i) != LUA_TTABLE || luaL_getmetafield(L, i, "__tostring") != LUA_TNIL) {
      if (lua_type(L, i) == LUA_TTABLE) lua_pop(L, 1);
      continue;
    }
    lua_pushvalue(L, -1);
    lua_pushvalue(L, i);
    if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_type(L, -1) == LUA_TSTRING) lua_replace(L, i);
    else lua_pop(L, 1);
  }
  lua_settop(L, n);
}

/* the results, prettified, through the global print */
static int print_k(lua_State *L) {
  int n = lua_gettop(L);
  luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
  prettify(L, n);
  lua_getglobal(L, "print");
  lua_insert(L, 1);
  lua_call(L, n, 0);
  return 0;
}

static void l_print(lua_State *L) {
  int n = lua_gettop(L);
  if (n > 0) {
    lua_pushcfunction(L, print_k);
    lua_insert(L, 1);
    if (lua_pcall(L, n, 0, 0) != LUA_OK)
      l_message(progname, lua_pushfstring(L, "error calling 'print' (%s)", errtext(L)));
    lua_settop(L, 0);
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void print_banner(lua_State *L) {
  static const char query[] =
      "local f = type(mp) == 'table' and mp.default_device\n"
      "return type(f) == 'function' and tostring(f()) or 'cpu'";
  int top = lua_gettop(L);
  const char *dev = "cpu";
  if (luaL_dostring(L, query) == LUA_OK && lua_type(L, -1) == LUA_TSTRING)
    dev = lua_tostring(L, -1);
  printf("mpengine %s  (%s)  device: %s\n", MP_VERSION, LUA_VERSION, dev);
  fflush(stdout);
  lua_settop(L, top);
}

static void doREPL(lua_State *L) {
  const char *oldprogname = progname;
  int status, timed = isatty(STDOUT_FILENO);
  progname = NULL; /* REPL errors need no "mpengine:" in front */
  interactive = 1;
  globalL = L;
  repl_init();
  setsignal(SIGINT, on_sigint, 0, NULL);
  setsignal(SIGWINCH, on_winch, SA_RESTART, NULL);
  print_banner(L);
  while ((status = loadline(L)) != LINE_EOF) {
    double t0 = now(), dt;
    if (status == LINE_INTR) continue;
    if (status == LUA_OK) status = docall(L, 0, LUA_MULTRET);
    if (status == LUA_OK) l_print(L);
    else report(L, status);
    dt = now() - t0;
    if (timed && dt >= SLOW_SECS) {
      printf("\033[2m(%.2f s)\033[0m\n", dt);
      fflush(stdout);
    }
  }
  lua_settop(L, 0);
  setsignal(SIGINT, SIG_DFL, 0, NULL);
  setsignal(SIGWINCH, SIG_DFL, 0, NULL);
  interactive = 0;
  progname = oldprogname;
}

/* ------------------------------------------------------------------ main */

static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  int script = argc;
  int args = collectargs(argc, argv, &script);
  luaL_checkversion(L);
  if (args == has_error) {
    print_badoption(argv[script]);
    return 0;
  }
  if (args & has_help) {
    print_usage(stdout);
    lua_pushboolean(L, 1);
    return 1;
  }
  if (args & has_v) print_version();
  if (args & has_E) { /* the package library reads this too */
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
  }
  luaL_openlibs(L);
  createargtable(L, argv, argc, script);
  lua_gc(L, LUA_GCRESTART);
  lua_gc(L, LUA_GCGEN, 0, 0);
  setup_package(L);
  if (dolibrary(L, "mp") != LUA_OK) return 0;
  if (!(args & has_E) && handle_luainit(L) != LUA_OK) return 0;
  if (device && setdevice(L, device) != LUA_OK) return 0;
  if (!runargs(L, argv, script)) return 0;
  if (script < argc && handle_script(L, argv + script) != LUA_OK) return 0;
  if (args & has_i) {
    doREPL(L);
  } else if (script == argc && !(args & (has_e | has_v))) {
    if (isatty(STDIN_FILENO)) doREPL(L);
    else if (dofile(L, NULL) != LUA_OK) return 0;
  }
  lua_pushboolean(L, 1);
  return 1;
}

int main(int argc, char **argv) {
  int status, result;
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    l_message(progname, "cannot create state: not enough memory");
    return EXIT_FAILURE;
  }
  lua_gc(L, LUA_GCSTOP); /* no collections while the libraries load */
  /* the CLI's C functions under which scripts run hold no tensors: a t:free()
     there releases at once (lua/lbind.c) */
  lb_outside_binding(pmain);
  lb_outside_binding(print_k);
  lb_outside_binding(prompt_k);
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  status = lua_pcall(L, 2, 1, 0);
  result = lua_toboolean(L, -1);
  report(L, status);
  /* a script that failed on one rank of mpirun's job: the others would wait
     for it in their next collective; end them all (MPI_Abort), as PyTorch's
     elastic launcher ends its workers when one fails */
  if (!(result && status == LUA_OK)) mp_dist_abort(1);
  lua_close(L);
  return (result && status == LUA_OK) ? EXIT_SUCCESS : EXIT_FAILURE;
}
