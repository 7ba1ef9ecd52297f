package sandbox

import (
	"bufio"
	"bytes"
	"cmp"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/units"
)

// Bounds a create may ask for, beyond the host's own (Limits).
const (
	MinCPU  = 10      // millicpus
	MinPids = 8       // a shell and a few children
	MaxPids = 4194304 // the kernel's PID_MAX_LIMIT: no pids cgroup counts more
	// MaxDisk is the largest disk a create may ask for: 1PiB, past any
	// store; whether the store has the room is decided when it is made.
	MaxDisk = 1 << 50
	// FallbackMaxMemory is the memory bound's ceiling when the host's
	// physical memory cannot be read.
	FallbackMaxMemory = 1 << 40
)

// Limits are the largest bounds a sandbox may have: the host's (what it
// can honour), or lower ones the server was given (shard serve
// --max-memory, --max-cpu, --max-pids).
type Limits struct {
	MemoryBytes int64  // the host's physical memory
	MemoryFrom  string // where MemoryBytes comes from, for messages
	CPUMillis   int64  // the host's cpus × 1000
	CPUFrom     string // where CPUMillis comes from
	Pids        int64  // MaxPids
	PidsFrom    string // where Pids comes from
}

// HostLimits reads this host's limits: its physical memory (MemTotal in
// /proc/meminfo; FallbackMaxMemory when that cannot be read) and its cpus.
func HostLimits() Limits {
	l := Limits{MemoryBytes: FallbackMaxMemory, MemoryFrom: "a fixed ceiling: this host's memory could not be read",
		CPUMillis: int64(runtime.NumCPU()) * 1000, CPUFrom: "its cpus", Pids: MaxPids, PidsFrom: "the kernel's limit"}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if n, ok := memTotal(b); ok {
			l.MemoryBytes, l.MemoryFrom = n, "this host's physical memory, MemTotal in /proc/meminfo"
		}
	}
	return l
}

// HostMemAvailable is MemAvailable of /proc/meminfo in bytes (0 when it
// cannot be read): what this host can still give.
func HostMemAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	n, _ := meminfo(b, "MemAvailable:")
	return n
}

// memTotal reads MemTotal (in bytes) from the text of /proc/meminfo.
func memTotal(text []byte) (int64, bool) { return meminfo(text, "MemTotal:") }

// meminfo reads one field (in bytes) from the text of /proc/meminfo.
func meminfo(text []byte, field string) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), field)
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil || kb <= 0 || kb > (1<<62)>>10 {
			return 0, false
		}
		return kb << 10, true
	}
	return 0, false
}

// Limits are the largest bounds a sandbox on this server may have: the
// host's, lowered by the server's configuration.
func (s *Service) Limits() Limits { return HostLimits().Lower(s.cfg.Limits) }

// Lower returns l with each bound that to gives (non-zero) and that is
// lower taken from to.
func (l Limits) Lower(to Limits) Limits {
	if to.MemoryBytes > 0 && to.MemoryBytes < l.MemoryBytes {
		l.MemoryBytes, l.MemoryFrom = to.MemoryBytes, to.MemoryFrom
	}
	if to.CPUMillis > 0 && to.CPUMillis < l.CPUMillis {
		l.CPUMillis, l.CPUFrom = to.CPUMillis, to.CPUFrom
	}
	if to.Pids > 0 && to.Pids < l.Pids {
		l.Pids, l.PidsFrom = to.Pids, to.PidsFrom
	}
	return l
}

// checkInherited refuses a sandbox whose bounds come from what it starts
// from (a checkpoint, a fork's source, an environment) when they are past
// this server's limits now: they were taken when it allowed more (a
// restart with a lower --max-memory, --max-cpu or --max-pids).
func checkInherited(what string, lim Limits, memory, cpu, pids int64) error {
	size := units.FormatSize
	switch {
	case memory > lim.MemoryBytes:
		return errdefs.Invalid("%s has memory %s, more than a sandbox may have here: at most %s (%s)", what, size(memory), size(lim.MemoryBytes), lim.MemoryFrom)
	case cpu > lim.CPUMillis:
		return errdefs.Invalid("%s has cpu %s, more than a sandbox may have here: at most %s (%s)", what, units.FormatCPU(cpu), units.FormatCPU(lim.CPUMillis), lim.CPUFrom)
	case lim.Pids > 0 && pids > lim.Pids:
		return errdefs.Invalid("%s has pids %d, more than a sandbox may have here: at most %d (%s)", what, pids, lim.Pids, lim.PidsFrom)
	}
	return nil
}

// withDefaults fills in the bounds a create leaves out (zero).
// A default past lim (a server with a low --max-memory or --max-cpu)
// is lowered to it.
func withDefaults(req *CreateRequest, lim Limits) {
	if req.MemoryBytes == 0 {
		req.MemoryBytes = DefaultMemory
		if lim.MemoryBytes > 0 {
			req.MemoryBytes = min(DefaultMemory, lim.MemoryBytes)
		}
	}
	if req.CPUMillis == 0 {
		req.CPUMillis = DefaultCPU
		if lim.CPUMillis > 0 {
			req.CPUMillis = min(DefaultCPU, lim.CPUMillis)
		}
	}
	if req.DiskBytes == 0 {
		req.DiskBytes = DefaultDisk
	}
	if req.Pids == 0 {
		req.Pids = DefaultPids
	}
}

// CheckCreate checks what a create asks for that needs no state: its name,
// its bounds against lim (zero ones take their defaults) and its
// variables. The API runs it before anything is done; Create runs it again.
func CheckCreate(req CreateRequest, lim Limits) error {
	withDefaults(&req, lim)
	return checkCreate(&req, lim)
}

// checkCreate is CheckCreate of a request whose defaults are filled in.
func checkCreate(req *CreateRequest, lim Limits) error {
	if err := validName(req.Name); err != nil {
		return err
	}
	if err := checkBounds(req, lim); err != nil {
		return err
	}
	if err := CheckEnv(req.Env); err != nil {
		return err
	}
	return names.NoNUL("image", req.Image)
}

// checkBounds refuses a bound this host cannot honour, each with the
// range it takes.
func checkBounds(req *CreateRequest, lim Limits) error {
	size := units.FormatSize
	maxPids, pidsFrom := int64(MaxPids), "the kernel's limit"
	if lim.Pids > 0 && lim.Pids < MaxPids {
		maxPids, pidsFrom = lim.Pids, lim.PidsFrom
	}
	switch {
	case req.MemoryBytes < MinMemory:
		return errdefs.Invalid("memory %s is too small: at least %s", size(req.MemoryBytes), size(MinMemory))
	case req.MemoryBytes > lim.MemoryBytes:
		return errdefs.Invalid("memory %s is more than this host can give: at most %s (%s)", size(req.MemoryBytes), size(lim.MemoryBytes), lim.MemoryFrom)
	case req.CPUMillis < MinCPU:
		return errdefs.Invalid("cpu %s is too little: at least %s (10m)", units.FormatCPU(req.CPUMillis), units.FormatCPU(MinCPU))
	case req.CPUMillis > lim.CPUMillis:
		return errdefs.Invalid("cpu %s is more than this host has: at most %s (%s)", units.FormatCPU(req.CPUMillis), units.FormatCPU(lim.CPUMillis), cmp.Or(lim.CPUFrom, "its cpus"))
	case req.DiskBytes < MinDisk:
		return errdefs.Invalid("disk %s is too small: at least %s", size(req.DiskBytes), size(MinDisk))
	case req.DiskBytes > MaxDisk:
		return errdefs.Invalid("disk %s is too large: at most %s", size(req.DiskBytes), size(MaxDisk))
	case req.Pids < MinPids || req.Pids > maxPids:
		return errdefs.Invalid("pids %d is out of range: from %d to %d (%s)", req.Pids, MinPids, maxPids, pidsFrom)
	}
	return nil
}

// Bounds of an exec's command and variables (and of a create's
// variables). Each exec's argv and variable names go into the ledger, so
// they are checked before anything is written; the kernel would refuse
// more anyway (one argument or variable up to 128KiB, MAX_ARG_STRLEN;
// all of them up to a quarter of the stack limit, 2MiB by default).
const (
	MaxArgs      = 4096
	MaxArgvBytes = 128 << 10 // the arguments' bytes, summed
	MaxEnvVars   = 1024
	MaxEnvBytes  = 128 << 10 // the variables' KEY=VALUE bytes, summed
)

// CheckArgv refuses an empty command, one with more than MaxArgs
// arguments or MaxArgvBytes of them, and arguments with a NUL byte. what
// names it in messages ("command", "setup command").
func CheckArgv(what string, argv []string) error {
	if len(argv) == 0 {
		return errdefs.Invalid("no command given: a %s needs at least the program", what)
	}
	if len(argv) > MaxArgs {
		return errdefs.Invalid("the %s has %d arguments: at most %d", what, len(argv), MaxArgs)
	}
	n := 0
	for _, a := range argv {
		n += len(a)
		if err := names.NoNUL(what+" argument", a); err != nil {
			return err
		}
	}
	if n > MaxArgvBytes {
		return errdefs.Invalid("the %s's arguments are %d bytes: at most %d (128KiB) in all (pass more on stdin, or in a file)", what, n, MaxArgvBytes)
	}
	return nil
}

// CheckEnv refuses more than MaxEnvVars variables or MaxEnvBytes of them,
// and any that is not KEY=VALUE (names.EnvVar).
func CheckEnv(env []string) error {
	if len(env) > MaxEnvVars {
		return errdefs.Invalid("env has %d variables: at most %d", len(env), MaxEnvVars)
	}
	n := 0
	for _, kv := range env {
		n += len(kv)
		if err := names.EnvVar(kv); err != nil {
			return err
		}
	}
	if n > MaxEnvBytes {
		return errdefs.Invalid("env is %d bytes: at most %d (128KiB) in all (pass more in a file)", n, MaxEnvBytes)
	}
	return nil
}
