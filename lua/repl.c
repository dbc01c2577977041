/*
 * repl.c: the mpengine REPL (repl.h): readline with a history file, Tab
 * completion of names and fields, auto-print of expressions (plain tables
 * through mp.pretty), multi-line input, the time of slow commands, and Ctrl-C
 * that drops the input being typed without ending the process. Running a
 * chunk is the host program's (mpengine.c): its docall stops running code on
 * Ctrl-C.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#include <lauxlib.h>
#include <lua.h>

#include "lua/lcore.h"
#include "lua/repl.h"

#ifndef MP_VERSION
#define MP_VERSION "unknown"
#endif

#define PROMPT      "mp> "
#define PROMPT2     "..> "
#define EOFMARK     "<eof>"
#define MARKLEN     (sizeof(EOFMARK) - 1)
#define HIST_MAX    1000
#define SLOW_SECS   0.1 /* REPL commands slower than this report their time */

/* loadline results besides Lua status codes */
#define LINE_EOF  (-1)
#define LINE_INTR (-2)

static lua_State *globalL = NULL;   /* for Tab completion, which readline calls without one */
static int use_readline = 0;
static char *histfile = NULL;
static volatile sig_atomic_t got_sigint = 0;
static volatile sig_atomic_t got_winch = 0;

static void on_sigint(int sig) { (void)sig; got_sigint = 1; }
static void on_winch(int sig) { (void)sig; got_winch = 1; }

/* flags: 0 for SIGINT, so that the plain reader's getline is woken by Ctrl-C
   (EINTR); SA_RESTART for SIGWINCH */
static void setsignal(int sig, void (*handler)(int), int flags) {
  struct sigaction sa;
  sa.sa_handler = handler;
  sa.sa_flags = flags;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}

/* REPL errors need no "mpengine:" in front */
static void message(const char *msg) {
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
}

static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    message(msg ? msg : "(error object is not a string)");
    lua_pop(L, 1);
  }
  return status;
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
    message(lua_pushfstring(L, "error reading _PROMPT (%s)", errtext(L)));
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

/*
 * "?name" (the line on top): runs require("mp.help").help("name"), the name
 * passed as a quoted string whatever it holds; a bare "?" is help(). Leaves
 * the line and the chunk, as addreturn does.
 */
static int helpline(lua_State *L) {
  size_t len, i;
  const char *line = lua_tolstring(L, -1, &len);
  luaL_Buffer b;
  const char *code;
  int status;
  for (line++, len--; len > 0 && (*line == ' ' || *line == '\t'); line++, len--) {}
  while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '\t' || line[len - 1] == '\r')) len--;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "return require('mp.help').help(");
  if (len > 0) {
    luaL_addchar(&b, '"');
    for (i = 0; i < len; i++) {
      unsigned char c = (unsigned char)line[i];
      if (c == '"' || c == '\\') { luaL_addchar(&b, '\\'); luaL_addchar(&b, (char)c); }
      else if (c < 0x20 || c == 0x7f) { char esc[8]; snprintf(esc, sizeof esc, "\\%03u", c); luaL_addstring(&b, esc); }
      else luaL_addchar(&b, (char)c);
    }
    luaL_addchar(&b, '"');
  }
  luaL_addchar(&b, ')');
  luaL_pushresult(&b);
  code = lua_tolstring(L, -1, &len);
  status = luaL_loadbuffer(L, code, len, "=stdin");
  lua_remove(L, -2); /* the code */
  saveline(lua_tostring(L, -2));
  return status;
}

static int loadline(lua_State *L) {
  int r, status;
  lua_settop(L, 0);
  if ((r = pushline(L, 1)) <= 0) return r == 0 ? LINE_EOF : LINE_INTR;
  if (lua_tostring(L, 1)[0] == '?') status = helpline(L);
  else if ((status = addreturn(L)) != LUA_OK) status = multiline(L);
  if (status == LINE_INTR) return status;
  lua_remove(L, 1);
  return status;
}

/* plain tables print through mp.pretty (keys and values, not an address),
   and functions (mp's by their documented names: function: mp.matmul); runs
   inside print_k's protected call */
static void prettify(lua_State *L, int n) {
  if (lua_getglobal(L, "mp") != LUA_TTABLE || lua_getfield(L, -1, "pretty") != LUA_TFUNCTION) {
    lua_settop(L, n);
    return;
  }
  for (int i = 1; i <= n; i++) {
    if (lua_type(L, i) == LUA_TFUNCTION) {
      /* no metatable to look at: mp.pretty names it or gives tostring's text */
    } else if (lua_type(L, i) != LUA_TTABLE || luaL_getmetafield(L, i, "__tostring") != LUA_TNIL) {
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

/* the results, prettified, through the global print, one a line (x:max(2):
   the values, then the indices) */
static int print_k(lua_State *L) {
  int n = lua_gettop(L);
  luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
  prettify(L, n);
  for (int i = 1; i <= n; i++) {
    lua_getglobal(L, "print");
    lua_pushvalue(L, i);
    lua_call(L, 1, 0);
  }
  return 0;
}

static void l_print(lua_State *L) {
  int n = lua_gettop(L);
  if (n > 0) {
    lua_pushcfunction(L, print_k);
    lua_insert(L, 1);
    if (lua_pcall(L, n, 0, 0) != LUA_OK)
      message(lua_pushfstring(L, "error calling 'print' (%s)", errtext(L)));
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

/* the global `help` is mp.help, unless the user's scripts took the name */
static void define_help(lua_State *L) {
  static const char code[] =
      "if help == nil and type(mp) == 'table' and type(mp.help) == 'function' then help = mp.help end";
  int top = lua_gettop(L);
  if (luaL_dostring(L, code) != LUA_OK)
    message(lua_pushfstring(L, "help is not defined (%s)", errtext(L)));
  lua_settop(L, top);
}

void repl_run(lua_State *L, int (*docall)(lua_State *L, int narg, int nres)) {
  int status, timed = isatty(STDOUT_FILENO);
  globalL = L;
  repl_init();
  setsignal(SIGINT, on_sigint, 0);
  setsignal(SIGWINCH, on_winch, SA_RESTART);
  define_help(L);
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
  setsignal(SIGINT, SIG_DFL, 0);
  setsignal(SIGWINCH, SIG_DFL, 0);
}

void repl_outside_binding(void) {
  lb_outside_binding(print_k);
  lb_outside_binding(prompt_k);
}
