package sandbox

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
)

// Admission. Two owners' bounds are checked before anything is made:
//
//   - the host's memory: the memory bounds of every sandbox that runs
//     (any state but stopped and failed) and every warm spare, summed,
//     stay within MemTotal × --memory-overcommit; past it a create, fork,
//     restore, resume or start is 507 insufficient_memory.
//   - each project's quota (shard project set): sandboxes, their memory
//     and cpu (running ones and spares), their disks (all), saved bytes
//     (checkpoints and snapshots) and ledger bytes; past one a request is
//     403 quota_exceeded naming it, the use and the limit.
//
// A check and the write that makes its use visible to the next check (a
// record inserted, a state moved to starting, a spare listed) happen under
// one lock, so concurrent requests never spend the same room twice.

// Admission is the Service's admission: its state, and the checks and
// reports over it (usage.go: what is on disk; space.go: room for captures).
type Admission struct {
	s          *Service         // whose records and saved things it sums
	hostMemory int64            // MemTotal × overcommit; 0: host memory not admitted
	overcommit float64          // Config.MemoryOvercommit, for messages
	disk       *hostdisk.Budget // the data directory's filesystem: Config.Disk
	floor      *ledgerFloor     // nil in tests that make a Service by hand: no floor

	mu     sync.Mutex
	spares map[string]*store.Sandbox // warm spares' records by id; guarded by mu
	ahead  map[string]bool           // sandboxes made ahead, by id (aheadFootprint each); guarded by mu
	quotas map[string]store.Quota    // projects' quotas, read once; nil: not yet; guarded by mu
	saving map[string]int64          // project → saved bytes promised to captures under way; guarded by mu
}

// checkLimit refuses one more sandbox past the server's limit. Every
// project's count, whoever asks: the limit is the server's, not a
// project's (a project's list gave each project a limit of its own). The
// address pool asks, holding itself, before it hands out an address.
func (a *Admission) checkLimit() error {
	if a.s.cfg.MaxSandboxes > 0 && a.s.cfg.Store.SandboxCount() >= a.s.cfg.MaxSandboxes {
		return errdefs.Conflict(client.CodeSandboxLimit, "this server holds at most %d sandboxes (forks count too): remove one first", a.s.cfg.MaxSandboxes)
	}
	return nil
}

// use is what a project holds, or what a request adds.
type use struct {
	sandboxes, memory, cpu, disk int64
}

// holdsMemory reports whether a sandbox in state st counts against memory
// and cpu: it runs, or is about to, or is still being taken down.
func holdsMemory(st string) bool { return st != StateStopped && st != StateFailed }

// newSandboxUse is what a new record of sb adds.
func newSandboxUse(sb *store.Sandbox) use {
	return use{sandboxes: 1, memory: sb.MemoryBytes, cpu: sb.CPUMillis, disk: sb.DiskBytes}
}

// tally sums what every project holds, and the host memory promised.
// Caller holds a.mu.
func (a *Admission) tally(ctx context.Context) (map[string]*use, int64, error) {
	sbs, err := a.s.cfg.Store.ListSandboxes(project.Unscoped(ctx, "admission sums every project's use"))
	if err != nil {
		return nil, 0, err
	}
	by := map[string]*use{}
	of := func(p string) *use {
		p = project.OrDefault(p)
		if by[p] == nil {
			by[p] = &use{}
		}
		return by[p]
	}
	var hostMem int64
	for _, sb := range sbs {
		u := of(sb.Project)
		u.sandboxes++
		u.disk += sb.DiskBytes
		if holdsMemory(sb.State) {
			u.memory += sb.MemoryBytes
			u.cpu += sb.CPUMillis
			hostMem += sb.MemoryBytes
		}
	}
	for _, sp := range a.spares {
		u := of(sp.Project)
		u.memory += sp.MemoryBytes
		u.cpu += sp.CPUMillis
		hostMem += sp.MemoryBytes
	}
	// No project's: a sandbox made ahead holds nothing of one.
	hostMem += int64(len(a.ahead)) * aheadFootprint
	return by, hostMem, nil
}

// NodeUsage is what this node's sandboxes and warm spares hold: how many
// sandboxes there are, and the memory promised to those that run (what a
// cluster's placement counts down).
func (a *Admission) NodeUsage(ctx context.Context) (sandboxes int, memory int64, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	by, hostMem, err := a.tally(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, u := range by {
		sandboxes += int(u.sandboxes)
	}
	return sandboxes, hostMem, nil
}

// quota is project p's quota. Caller holds a.mu.
func (a *Admission) quota(ctx context.Context, p string) (store.Quota, error) {
	if a.quotas == nil {
		qs, err := a.s.cfg.Store.ProjectQuotas(ctx)
		if err != nil {
			return store.Quota{}, err
		}
		a.quotas = qs
	}
	return a.quotas[project.OrDefault(p)], nil
}

// admitLocked checks that add, for sb (what names it for messages, e.g.
// "sandbox web"), fits the host's memory and sb's project's quota. Caller
// holds a.mu, and keeps it until the use is visible to tally.
func (a *Admission) admitLocked(ctx context.Context, sb *store.Sandbox, add use, what string) error {
	by, hostMem, err := a.tally(ctx)
	if err != nil {
		return err
	}
	if cap := a.hostMemory; cap > 0 && add.memory > 0 && hostMem+add.memory > cap {
		return errdefs.New(errdefs.KindNoSpace, client.CodeInsufficientMemory,
			"not enough memory for %s: it asks for %s, and the sandboxes running here and their warm spares are promised %s of the %s this host admits (its memory × %g, shard serve --memory-overcommit); stop or remove sandboxes, or give a smaller --memory",
			what, units.FormatSize(add.memory), units.FormatSize(hostMem), units.FormatSize(cap), a.overcommit)
	}
	p := recProject(ctx, sb)
	q, err := a.quota(ctx, p)
	if err != nil {
		return err
	}
	have := use{}
	if u := by[p]; u != nil {
		have = *u
	}
	for _, c := range []struct {
		limit, has, add int64
		what, flag      string
		size            bool
	}{
		{q.Sandboxes, have.sandboxes, add.sandboxes, "sandboxes", "--max-sandboxes", false},
		{q.MemoryBytes, have.memory, add.memory, "memory of running sandboxes", "--max-memory", true},
		{q.CPUMillis, have.cpu, add.cpu, "cpu of running sandboxes", "--max-cpu", false},
		{q.DiskBytes, have.disk, add.disk, "disk of sandboxes", "--max-disk", true},
	} {
		if c.limit > 0 && c.add > 0 && c.has+c.add > c.limit {
			return quotaErr(p, what, c.what, c.flag, c.has, c.add, c.limit, c.size)
		}
	}
	return nil
}

// recProject is sb's project: its own, or (a record not yet stored) the
// one ctx makes it in.
func recProject(ctx context.Context, sb *store.Sandbox) string {
	if sb.Project != "" {
		return sb.Project
	}
	return project.Of(ctx)
}

// quotaErr is the 403 of a request past project p's quota.
func quotaErr(p, what, of, flag string, has, add, limit int64, size bool) error {
	f := func(n int64) string { return fmt.Sprint(n) }
	switch {
	case size:
		f = units.FormatSize
	case strings.HasPrefix(of, "cpu"):
		f = func(n int64) string { return units.FormatCPU(n) }
	}
	return errdefs.New(errdefs.KindForbidden, client.CodeQuotaExceeded,
		"project %s's quota of %s is %s: it holds %s, and %s asks for %s more; remove or stop what it holds, or have an administrator raise the quota (shard project set %s %s)",
		p, of, f(limit), f(has), what, f(add), p, flag)
}

// admit is admitLocked under a.mu, then made (make writes what holds the
// use: a record, a state, a spare's entry) before the next admission.
func (a *Admission) admit(ctx context.Context, sb *store.Sandbox, add use, what string, make func() error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.admitLocked(ctx, sb, add, what); err != nil {
		return err
	}
	return make()
}

// precheck refuses early, before any work, what admission would refuse
// now: n sandboxes of sb's bounds. The record's own admission checks again.
func (a *Admission) precheck(ctx context.Context, sb *store.Sandbox, n int64, what string) error {
	u := newSandboxUse(sb)
	u = use{sandboxes: u.sandboxes * n, memory: u.memory * n, cpu: u.cpu * n, disk: u.disk * n}
	return a.admit(ctx, sb, u, what, func() error { return nil })
}

// holdSpare counts a warm spare's memory and cpu until dropSpare or
// unholdSpare; it fails when they do not fit.
func (a *Admission) holdSpare(ctx context.Context, rec *store.Sandbox) error {
	return a.admit(ctx, rec, use{memory: rec.MemoryBytes, cpu: rec.CPUMillis}, "a warm spare of its environment", func() error {
		if a.spares == nil {
			a.spares = map[string]*store.Sandbox{}
		}
		a.spares[rec.ID] = rec
		return nil
	})
}

// holdAhead counts a sandbox made ahead against the host's memory (what it
// holds idle) until unholdAhead (a record that takes it ends the hold in
// insertRecords);
// it fails when that does not fit.
func (a *Admission) holdAhead(ctx context.Context, id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, hostMem, err := a.tally(ctx)
	if err != nil {
		return err
	}
	if cap := a.hostMemory; cap > 0 && hostMem+aheadFootprint > cap {
		return fmt.Errorf("no memory for a sandbox made ahead: %s of the %s this host admits are promised", units.FormatSize(hostMem), units.FormatSize(cap))
	}
	if a.ahead == nil {
		a.ahead = map[string]bool{}
	}
	a.ahead[id] = true
	return nil
}

// aheadHeld counts the sandboxes made ahead held against the host.
func (a *Admission) aheadHeld() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ahead)
}

func (a *Admission) unholdAhead(id string) {
	a.mu.Lock()
	delete(a.ahead, id)
	a.mu.Unlock()
}

func (a *Admission) unholdSpare(id string) {
	a.mu.Lock()
	delete(a.spares, id)
	a.mu.Unlock()
}

// SetQuota sets project p's quota (the zero Quota: none).
func (a *Admission) SetQuota(ctx context.Context, p string, q store.Quota) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.s.cfg.Store.SetProjectQuota(ctx, p, q); err != nil {
		return err
	}
	a.quotas = nil // read again at the next admission
	return nil
}

// ProjectUse is what a project holds against its quota.
type ProjectUse struct {
	Quota                        store.Quota
	Sandboxes, Memory, CPU, Disk int64
	SavedBytes, LedgerBytes      int64
}

// ProjectUses is what every project named in ps holds, with its quota.
func (a *Admission) ProjectUses(ctx context.Context, ps []string) (map[string]ProjectUse, error) {
	a.mu.Lock()
	by, _, err := a.tally(ctx)
	if err != nil {
		a.mu.Unlock()
		return nil, err
	}
	out := map[string]ProjectUse{}
	for _, p := range ps {
		q, err := a.quota(ctx, p)
		if err != nil {
			a.mu.Unlock()
			return nil, err
		}
		u := ProjectUse{Quota: q}
		if h := by[p]; h != nil {
			u.Sandboxes, u.Memory, u.CPU, u.Disk = h.sandboxes, h.memory, h.cpu, h.disk
		}
		out[p] = u
	}
	a.mu.Unlock()
	for _, p := range ps {
		u := out[p]
		pctx := project.With(ctx, p)
		if u.SavedBytes, err = a.savedBytes(pctx); err != nil {
			return nil, err
		}
		if u.LedgerBytes, err = a.s.cfg.Store.LedgerBytes(ctx, p); err != nil {
			return nil, err
		}
		out[p] = u
	}
	return out, nil
}

// savedBytes is what the checkpoints (environments' among them) and
// snapshots of ctx's project take.
func (a *Admission) savedBytes(ctx context.Context) (int64, error) {
	var n int64
	cks, err := a.s.cfg.Store.ListCheckpoints(ctx, "")
	if err != nil {
		return 0, err
	}
	for _, ck := range cks {
		n += a.s.saved.checkpointSize(ck.ID)
	}
	sns, err := a.s.cfg.Store.ListSnapshots(ctx)
	if err != nil {
		return 0, err
	}
	for _, sn := range sns {
		n += a.s.saved.SnapshotSize(sn.ID)
	}
	return n, nil
}

// reserveSaved admits a capture of src (a checkpoint, a fork's, an
// environment's, a snapshot) that may take host bytes of the host's disk
// (a memory image) and files bytes of the store (the sandbox's files, whose
// room the store admits itself): host+files against src's project's saved
// bytes quota, host against the host's disk (hostdisk), until release.
func (a *Admission) reserveSaved(ctx context.Context, src *store.Sandbox, host, files int64, what string) (release func(), err error) {
	need := host + files
	p := recProject(ctx, src)
	a.mu.Lock()
	q, err := a.quota(ctx, p)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	unsave := func() {}
	if q.SavedBytes > 0 {
		has, err := a.savedBytes(project.With(ctx, p))
		if err != nil {
			return nil, err
		}
		a.mu.Lock()
		has += a.saving[p]
		if has+need > q.SavedBytes {
			a.mu.Unlock()
			return nil, quotaErr(p, what, "saved bytes (checkpoints and snapshots)", "--max-saved-bytes", has, need, q.SavedBytes, true)
		}
		if a.saving == nil {
			a.saving = map[string]int64{}
		}
		a.saving[p] += need
		a.mu.Unlock()
		var once sync.Once
		unsave = func() {
			once.Do(func() {
				a.mu.Lock()
				a.saving[p] -= need
				a.mu.Unlock()
			})
		}
	}
	releaseHost, err := a.disk.Take(host, what)
	if err != nil {
		unsave()
		return nil, err
	}
	return func() { releaseHost(); unsave() }, nil
}

// ledgerRoom fails when a request that adds to project p's ledger (what
// says what it would record) finds the data directory below its floor, or
// p's ledger at its quota.
func (a *Admission) ledgerRoom(ctx context.Context, p, what string) error {
	if err := a.floor.check(what); err != nil {
		return err
	}
	p = project.OrDefault(p)
	a.mu.Lock()
	q, err := a.quota(ctx, p)
	a.mu.Unlock()
	if err != nil || q.LedgerBytes <= 0 {
		return err
	}
	has, err := a.s.cfg.Store.LedgerBytes(ctx, p)
	if err != nil {
		return err
	}
	if has >= q.LedgerBytes {
		return errdefs.New(errdefs.KindForbidden, client.CodeQuotaExceeded,
			"cannot %s: project %s's ledger holds %s, and its quota is %s (shard project set %s --max-ledger-bytes); nothing was done. Remove ledger sessions it no longer needs (shard ledger rm) or have an administrator raise the quota",
			what, p, units.FormatSize(has), units.FormatSize(q.LedgerBytes), p)
	}
	return nil
}
