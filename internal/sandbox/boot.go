package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/useshards/shard/internal/agent/host"
	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/hostdir"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/oci"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/revert"
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/store"
)

func (s *Service) runDir(id string) string { return filepath.Join(s.cfg.DataDir, "run", id) }

// boot mounts the rootfs, makes the network and starts the runtime, then
// waits for the agent. On error it undoes its own steps.
func (s *Service) boot(ctx context.Context, sb *store.Sandbox, layers []string) error {
	return s.bootWith(ctx, sb, layers, func(p provider.Provider, inst *provider.Instance) error {
		return p.Start(ctx, inst)
	})
}

// bootWith prepares a sandbox instance (rootfs, network, spec) and hands it
// to run, which starts it (or restores it from a checkpoint); then it waits
// for the agent. On error it undoes every step it made.
func (s *Service) bootWith(ctx context.Context, sb *store.Sandbox, layers []string, run func(provider.Provider, *provider.Instance) error) error {
	st, err := s.stage(ctx, sb, layers)
	if err != nil {
		return err
	}
	return s.launch(ctx, st, run)
}

// staged is a sandbox instance made ready to start: rootfs mounted, netns
// made, spec written; undo takes it down again.
type staged struct {
	sb   *store.Sandbox
	p    provider.Provider
	inst *provider.Instance
	undo *revert.Reverter // takes down what stage made
	t0   time.Time
}

// abort takes the staged instance down (once, however often it is called).
func (st *staged) abort() { st.undo.Fail() }

// stage mounts the rootfs, makes the network namespace and builds the spec.
// On error it undoes its own steps.
func (s *Service) stage(ctx context.Context, sb *store.Sandbox, layers []string) (*staged, error) {
	if layers == nil {
		img, err := s.cfg.Images.Get(ctx, sb.ImageDigest)
		if err != nil {
			return nil, fmt.Errorf("image %s of sandbox %s: %w", sb.Image, sb.Name, err)
		}
		layers = img.Layers
	}
	return s.stageWith(ctx, sb, func(rootfsDir string) error {
		return s.cfg.Storage.Mount(ctx, sb.ID, layers, rootfsDir)
	})
}

// stageWith is stage with the sandbox's root made at rootfsDir by root:
// its files (stage), or an empty placeholder that they are mounted over
// later (a sandbox made ahead).
func (s *Service) stageWith(ctx context.Context, sb *store.Sandbox, root func(rootfsDir string) error) (_ *staged, err error) {
	st := &staged{sb: sb, p: s.providers[sb.Provider], t0: time.Now(), undo: revert.New()}
	defer func() {
		if err != nil {
			st.abort()
		}
	}()
	dir := s.runDir(sb.ID)
	if err := hostdir.Private(dir); err != nil {
		return nil, err
	}
	rootfsDir := filepath.Join(dir, "rootfs")
	if err := root(rootfsDir); err != nil {
		return nil, err
	}
	// (The id, not sb: a sandbox made ahead is given a record later.)
	id := sb.ID
	st.undo.Add(func() { rootfs.Unmount(rootfsDir); s.cfg.Storage.Detach(id) })
	st.phase(s, "rootfs")
	ip, err := netip.ParseAddr(sb.IP)
	if err != nil {
		return nil, err
	}
	// The egress policy keys on the address: install this sandbox's (or
	// clear what an earlier holder of the address had) before anything
	// can leave it.
	if err := s.applyPolicy(sb); err != nil {
		return nil, fmt.Errorf("network policy: %w", err)
	}
	s.cfg.Net.Delete(id) // a leftover of a crash would block the name
	nsPath, err := s.cfg.Net.Create(ctx, id, ip)
	if err != nil {
		return nil, err
	}
	st.undo.Add(func() { s.cfg.Net.Delete(id) })
	st.phase(s, "netns")
	if st.inst, err = s.instance(sb, rootfsDir, nsPath); err != nil {
		return nil, err
	}
	// From here the runtime may hold a container: take it down on undo.
	st.undo.Add(func() { st.p.Delete(context.Background(), id) })
	return st, nil
}

func (st *staged) phase(s *Service, name string) {
	s.cfg.Log.Debug("boot phase", "sandbox", st.sb.ID, "phase", name, "at", time.Since(st.t0))
}

// launch runs a staged instance and waits for its agent. On error it takes
// the instance down.
func (s *Service) launch(ctx context.Context, st *staged, run func(provider.Provider, *provider.Instance) error) (err error) {
	defer func() {
		if err != nil {
			st.abort()
		}
	}()
	if err := run(st.p, st.inst); err != nil {
		return err
	}
	st.phase(s, "runtime")
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.agentFor(st.sb).WaitReady(actx); err != nil {
		return fmt.Errorf("sandbox did not come up: %w (agent log: %s)", err, tail(readTail(st.inst.LogOut, 4096), 400))
	}
	st.phase(s, "agent")
	return nil
}

// readTail reads at most the last n bytes of a file (a runtime's log, which
// a sandbox may have written to).
func readTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

func (s *Service) agentFor(sb *store.Sandbox) *host.Client {
	if s.cfg.AgentAddr != nil {
		return &host.Client{Addr: s.cfg.AgentAddr(sb), Token: sb.Token}
	}
	return &host.Client{Addr: netip.AddrPortFrom(netip.MustParseAddr(sb.IP), proto.Port).String(), Token: sb.Token}
}

// halt stops the runtime and takes down mounts and network; files stay. It
// returns the OOM kills the instance counted.
func (s *Service) halt(ctx context.Context, sb *store.Sandbox, graceful bool) int64 {
	p := s.providers[sb.Provider]
	s.mem.unwatch(sb.ID)
	var ooms int64
	// Every runtime call is bounded: a Sentry that cannot answer (wedged,
	// stopped) makes runsc wait for ever, and would hold the stop, the
	// sandbox's lock and its execs with it.
	rctx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, runtimeCallTimeout) }
	if graceful {
		c, cancel := rctx()
		st, _ := p.Status(c, sb.ID)
		cancel()
		if st == provider.StatusRunning {
			// Ask the agent while it still answers: after the kill, a dial
			// to its address only times out.
			ooms += s.agentOOMKills(ctx, sb)
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			s.agentFor(sb).Call(sctx, proto.OpSync)
			cancel()
			pid := 0
			if pider, ok := p.(provider.PIDer); ok {
				c, cancel := rctx()
				pid, _ = pider.InitPID(c, sb.ID)
				cancel()
			}
			c, cancel := rctx()
			err := p.Kill(c, sb.ID, 15)
			cancel()
			if err == nil {
				s.waitEnded(ctx, p, sb.ID, pid)
			}
		}
	}
	ooms += s.cgroupOOMKills(sb)
	c, cancel := rctx()
	err := p.Delete(c, sb.ID)
	cancel()
	if err != nil {
		// The runtime could not take it down in time: kill every process
		// in the sandbox's cgroups (the runtime's own too), then ask again.
		n := killCgroups(sb.ID)
		c, cancel := rctx()
		err = p.Delete(c, sb.ID)
		cancel()
		s.cfg.Log.Warn("delete container: the runtime did not answer; killed the sandbox's processes", "sandbox", sb.ID, "killed", n, "err", err)
	}
	rootfs.Unmount(filepath.Join(s.runDir(sb.ID), "rootfs"))
	s.cfg.Storage.Detach(sb.ID)
	s.cfg.Net.Delete(sb.ID)
	s.cfg.Metrics.OOMKills(sb.Provider, ooms)
	return ooms
}

// runtimeCallTimeout bounds one runtime call of a halt.
const runtimeCallTimeout = 10 * time.Second

// killCgroups sends SIGKILL to every process in sandbox id's cgroups, under
// every controller (v1) and the unified hierarchy, and returns how many.
func killCgroups(id string) int {
	seen := map[int]bool{}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + oci.CgroupsPath(id))
	dirs = append(dirs, "/sys/fs/cgroup"+oci.CgroupsPath(id))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && !seen[pid] {
				seen[pid] = true
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return len(seen)
}

// destroy removes every piece of a sandbox and its record, and writes its
// removal to its ledger session, which outlives it.
func (s *Service) destroy(ctx context.Context, sb *store.Sandbox, log *slog.Logger) error {
	return s.teardown(ctx, sb, log, func() error {
		return s.cfg.Store.DeleteSandbox(ctx, sb.ID, &store.EventSpec{Type: ledger.Removed})
	})
}

// discard removes every piece of a sandbox that never ran: the undo of a
// create, fork or restore that failed or was refused, or of one a crash
// interrupted. Its record goes with the events it wrote and the ledger
// session it started: what never was leaves no history (the caller's
// error says why).
func (s *Service) discard(ctx context.Context, sb *store.Sandbox, log *slog.Logger) error {
	return s.teardown(ctx, sb, log, func() error { return s.cfg.Store.DiscardSandbox(ctx, sb.ID) })
}

// teardown removes every piece of a sandbox, then its record with drop.
func (s *Service) teardown(ctx context.Context, sb *store.Sandbox, log *slog.Logger, drop func() error) error {
	s.halt(ctx, sb, false)
	s.execs.end(sb.ID, "sandbox "+sb.Name+" was removed while the command ran")
	var errs []error
	if ip, err := netip.ParseAddr(sb.IP); err == nil && sb.Policy != nil {
		if err := s.cfg.Net.SetPolicy(ip, nil); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.cfg.Storage.Remove(ctx, sb.ID); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(s.runDir(sb.ID)); err != nil {
		errs = append(errs, err)
	}
	if err := drop(); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		log.Error("remove", "err", err)
		return err
	}
	return nil
}

// waitEnded waits up to the stop timeout for the runtime to end after a
// kill: by watching its host process when the provider names it (a stat of
// /proc), else by asking the runtime (a process per look).
func (s *Service) waitEnded(ctx context.Context, p provider.Provider, id string, pid int) {
	deadline := time.Now().Add(s.cfg.StopTimeout)
	for time.Now().Before(deadline) {
		if pid > 0 {
			if !processAlive(pid) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		c, cancel := context.WithDeadline(ctx, deadline)
		st, err := p.Status(c, id)
		cancel()
		if err != nil || st != provider.StatusRunning {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
