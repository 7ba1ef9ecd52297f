package sandbox

import (
	"bufio"
	"bytes"
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
	MinCPU = 10 // millicpus
	// MinGvisorCPU is gVisor's floor: its kernel boots in user space, and
	// at 10m a sandbox took over 100 s to answer (50m: 16 s).
	MinGvisorCPU = 100
	MinPids      = 8       // a shell and a few children
	MaxPids      = 4194304 // the kernel's PID_MAX_LIMIT: no pids cgroup counts more
	// MaxDisk is the largest disk a create may ask for: 1PiB, past any
	// store; whether the store has the room is decided when it is made.
	MaxDisk = 1 << 50
	// FallbackMaxMemory is the memory bound's ceiling when the host's
	// physical memory cannot be read.
	FallbackMaxMemory = 1 << 40
)

// Limits are the largest bounds this host can honour.
type Limits struct {
	MemoryBytes int64  // the host's physical memory
	MemoryFrom  string // where MemoryBytes comes from, for messages
	CPUMillis   int64  // the host's cpus × 1000
}

// HostLimits reads this host's limits: its physical memory (MemTotal in
// /proc/meminfo; FallbackMaxMemory when that cannot be read) and its cpus.
func HostLimits() Limits {
	l := Limits{MemoryBytes: FallbackMaxMemory, MemoryFrom: "a fixed ceiling: this host's memory could not be read", CPUMillis: int64(runtime.NumCPU()) * 1000}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if n, ok := memTotal(b); ok {
			l.MemoryBytes, l.MemoryFrom = n, "this host's physical memory, MemTotal in /proc/meminfo"
		}
	}
	return l
}

// memTotal reads MemTotal (in bytes) from the text of /proc/meminfo.
func memTotal(meminfo []byte) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
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

// Limits are the largest bounds a sandbox on this server may have.
func (s *Service) Limits() Limits { return HostLimits() }

// withDefaults fills in the bounds a create leaves out (zero).
func withDefaults(req *CreateRequest) {
	if req.MemoryBytes == 0 {
		req.MemoryBytes = DefaultMemory
	}
	if req.CPUMillis == 0 {
		req.CPUMillis = DefaultCPU
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
	withDefaults(&req)
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
	switch {
	case req.MemoryBytes < MinMemory:
		return errdefs.Invalid("memory %s is too small: at least %s", size(req.MemoryBytes), size(MinMemory))
	case req.MemoryBytes > lim.MemoryBytes:
		return errdefs.Invalid("memory %s is more than this host can give: at most %s (%s)", size(req.MemoryBytes), size(lim.MemoryBytes), lim.MemoryFrom)
	case req.CPUMillis < MinCPU:
		return errdefs.Invalid("cpu %s is too little: at least %s (10m)", units.FormatCPU(req.CPUMillis), units.FormatCPU(MinCPU))
	case req.CPUMillis > lim.CPUMillis:
		return errdefs.Invalid("cpu %s is more than this host has: at most %s (its cpus)", units.FormatCPU(req.CPUMillis), units.FormatCPU(lim.CPUMillis))
	case req.DiskBytes < MinDisk:
		return errdefs.Invalid("disk %s is too small: at least %s", size(req.DiskBytes), size(MinDisk))
	case req.DiskBytes > MaxDisk:
		return errdefs.Invalid("disk %s is too large: at most %s", size(req.DiskBytes), size(MaxDisk))
	case req.Pids < MinPids || req.Pids > MaxPids:
		return errdefs.Invalid("pids %d is out of range: from %d to %d (the kernel's limit)", req.Pids, MinPids, MaxPids)
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
