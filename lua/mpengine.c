/*
 * mpengine.c: the `mpengine` command, a Lua 5.4 host modelled on lua.c.
 *
 * It links the C half of the `mp` module in (package.preload["mp.core"]),
 * points package.path at the Lua half found beside the executable, loads
 * `mp` as a global, applies --device, then runs -e/-l options, a script,
 * standard input, or the REPL (repl.c, with `help` as a global). Ctrl-C stops running code (docall:
 * a hook at the next line) without ending the process when in the REPL.
 */

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "lua/lcore.h"
#include "lua/repl.h"
#include "engine/dist.h"

#ifndef MP_VERSION
#define MP_VERSION "unknown"
#endif

#define LUA_VDIR    LUA_VERSION_MAJOR "." LUA_VERSION_MINOR
#define INIT_VAR    "LUA_INIT"
#define INIT_VARV   INIT_VAR "_" LUA_VERSION_MAJOR "_" LUA_VERSION_MINOR

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
    "script. REPL history: $MPENGINE_HISTORY, else ~/.mpengine_history.\n"
    "In the REPL, help() lists the areas of the API reference, and\n"
    "help(mp.matmul) or ?mp.matmul prints a name's entry (docs/API.md).\n",
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

/* ------------------------------------------------------------------ REPL */

/* the REPL (repl.c), its errors without "mpengine:" and with a second Ctrl-C
   only re-arming the hook (laction) */
static void doREPL(lua_State *L) {
  const char *oldprogname = progname;
  progname = NULL;
  interactive = 1;
  repl_run(L, docall);
  interactive = 0;
  progname = oldprogname;
}

/* ------------------------------------------------------------------ main */

/* os.exit leaves mp.dist's world first, as the script's end does (main): C's
   exit handlers, mp.dist's among them, run after the destructors of statics
   made since mp.dist.init, which the device's leaving may still run through
   (the emulated device's queued matmuls through oneDNN's JIT kernels: a
   segfault) */
static int os_exit_leaving(lua_State *L) {
  if (!lua_isboolean(L, 1)) luaL_optinteger(L, 1, EXIT_SUCCESS); /* os.exit's own refusal, before leaving */
  mp_dist_finalize_at_exit();
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

static void wrap_os_exit(lua_State *L) {
  lua_getglobal(L, "os");
  lua_getfield(L, -1, "exit");
  lua_pushcclosure(L, os_exit_leaving, 1);
  lua_setfield(L, -2, "exit");
  lua_pop(L, 1);
}

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
  wrap_os_exit(L);
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
  repl_outside_binding();
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
  /* a script that ended without mp.dist.finalize() leaves here, while its
     tensors and every library's statics are alive, not in the atexit hook
     (engine/dist.h) */
  else mp_dist_finalize_at_exit();
  lua_close(L);
  return (result && status == LUA_OK) ? EXIT_SUCCESS : EXIT_FAILURE;
}
