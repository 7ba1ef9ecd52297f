package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sync/atomic"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/fsdiff"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/oci"
	"github.com/useshards/shard/internal/store"
)

// serverPaths are what the server itself puts in every sandbox's files,
// left out of diffs by exact path while each is of the type the server
// makes (a file of the sandbox's where the server has a directory shows):
// the agent's mount point and binary, the host files it binds over, and
// the fork contract's directory. The fork
// contract's file (each fork's own identity, different by design) is left
// out only while it holds what the server wrote (forkFile). Anything else
// under /.shard or /run/shard is the sandbox's own, and shows: it persists
// across stop and start and reaches forks and snapshots like any file.
var serverPaths = []fsdiff.Skip{{Path: oci.AgentDir, Type: "dir"}, {Path: oci.AgentPath, Type: "file"},
	{Path: "/etc/hosts", Type: "file"}, {Path: "/etc/hostname", Type: "file"}, {Path: "/etc/resolv.conf", Type: "file"},
	{Path: path.Dir(proto.ForkFile), Type: "dir"},
	// Made by the server above its own paths where the image has none
	// (busybox has no /run).
	{Path: "/run", Type: "dir", IfAdded: true}, {Path: "/etc", Type: "dir", IfAdded: true}}

// DefaultMaxDiffs bounds the diffs a server runs at once (Config.MaxDiffs):
// each holds two mounted copies of a sandbox's files while it reads them.
const DefaultMaxDiffs = 4

// DiffSide names one side of a diff.
type DiffSide struct {
	Kind string `json:"kind"` // sandbox, checkpoint, snapshot, image
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
}

// DiffResult is what changed from From to To.
type DiffResult struct {
	From DiffSide `json:"from"`
	To   DiffSide `json:"to"`
	*fsdiff.Result
}

// DiffOptions say what to compare a sandbox with.
type DiffOptions struct {
	Against string // a sandbox of the same image; "": what it started from
	Patch   bool   // text diffs of changed text files
}

// Diff lists what changed in the files of sandbox idOrName since o.Against
// (another sandbox of its image, usually of its lineage) or, without it,
// since it started: the checkpoint it was forked or restored from, the
// snapshot it was made from, or its image. Each side is a private copy of
// the files of one instant (rootfs.View); only what either side changed
// over the image is read (fsdiff).
//
// A diff waits for one of Config.MaxDiffs slots, and ends, with ctx's
// error, when ctx does (its client went away), waiting or reading.
func (f *Files) Diff(ctx context.Context, idOrName string, o DiffOptions) (*DiffResult, error) {
	to, err := f.s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	res := &DiffResult{To: DiffSide{Kind: "sandbox", ID: to.ID, Name: to.Name}}
	var from *store.Sandbox
	key := ""             // a saved copy's, for the from side
	var fromFork forkFile // what the from side's fork file may hold
	if o.Against != "" {
		if from, err = f.s.cfg.Store.GetSandbox(ctx, o.Against); err != nil {
			return nil, err
		}
		if from.ImageDigest != to.ImageDigest {
			return nil, errdefs.New(errdefs.KindInvalid, client.CodeDifferentImages,
				"sandbox %s is of image %s and %s of %s: a diff compares sandboxes of one image (a lineage)", from.Name, from.Image, to.Name, to.Image)
		}
		res.From = DiffSide{Kind: "sandbox", ID: from.ID, Name: from.Name}
		fromFork = forkFile{want: bootIdentity(from)}
	} else {
		if res.From, key, fromFork, err = f.startedFrom(ctx, to); err != nil {
			return nil, err
		}
	}
	done, err := f.diffs.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	img, err := f.s.cfg.Images.Get(ctx, to.ImageDigest)
	if err != nil {
		return nil, fmt.Errorf("image %s of sandbox %s: %w", to.Image, to.Name, err)
	}
	dir, err := os.MkdirTemp(filepath.Join(f.s.cfg.DataDir, "run"), "diff-")
	if err != nil {
		return nil, err
	}
	// The copies go once the answer is on its way: unmounting them is a
	// good part of a diff's time, and nobody waits for it.
	var releases []func()
	defer func() {
		go func() {
			for _, r := range releases {
				r()
			}
			os.RemoveAll(dir)
		}()
	}()
	toDir := filepath.Join(dir, "to")
	release, err := f.s.cfg.Storage.View(ctx, to.ID, "", toDir)
	if err != nil {
		return nil, fmt.Errorf("the files of %s: %w", to.Name, err)
	}
	releases = append(releases, release)
	fromUpper := filepath.Join(dir, "image") // an empty upper: the image as it is
	if err := os.Mkdir(fromUpper, 0o700); err != nil {
		return nil, err
	}
	if res.From.Kind != "image" {
		fromDir := filepath.Join(dir, "from")
		id := ""
		if from != nil {
			id = from.ID
		}
		rel, err := f.s.cfg.Storage.View(ctx, id, key, fromDir)
		if err != nil {
			return nil, fmt.Errorf("the files of %s %s: %w", res.From.Kind, res.From.Name, err)
		}
		releases = append(releases, rel)
		fromUpper = filepath.Join(fromDir, "upper")
	}
	r, err := fsdiff.Diff(ctx, fsdiff.Tree{Upper: fromUpper}, fsdiff.Tree{Upper: filepath.Join(toDir, "upper")}, img.Layers, fsdiff.Options{
		Patch: o.Patch, Skip: serverPaths,
		Written: []fsdiff.Written{{Path: proto.ForkFile, A: fromFork.matcher(), B: forkFile{want: bootIdentity(to)}.matcher()}},
	})
	if err != nil {
		return nil, err
	}
	res.Result = r
	return res, nil
}

// startedFrom is what sb started from (see Diff), the key of its saved
// files (none for the image) and what their fork file may hold.
func (f *Files) startedFrom(ctx context.Context, sb *store.Sandbox) (DiffSide, string, forkFile, error) {
	evs, err := f.s.cfg.Store.Events(ctx, sb.Session, 0, 1)
	if err != nil {
		return DiffSide{}, "", forkFile{}, err
	}
	var d ledger.CreatedData
	if len(evs) > 0 && evs[0].Type == ledger.Created {
		json.Unmarshal(evs[0].Data, &d)
	}
	switch {
	case d.Checkpoint != "":
		ck, err := f.s.cfg.Store.GetCheckpoint(ctx, d.Checkpoint)
		if err != nil {
			if errdefs.Is(err, errdefs.KindNotFound) {
				return DiffSide{}, "", forkFile{}, errdefs.Conflict(client.CodeCheckpointGone,
					"sandbox %s started from checkpoint %s, which was removed since: compare it with another sandbox (against)", sb.Name, d.Checkpoint)
			}
			return DiffSide{}, "", forkFile{}, err
		}
		ff, err := f.savedForkFile(ctx, ck.SandboxID, ck.SandboxName)
		return DiffSide{Kind: "checkpoint", ID: ck.ID, Name: ck.SandboxName}, checkpointKey(ck.ID), ff, err
	case d.FromSnapshot != "":
		sn, err := f.s.cfg.Store.GetSnapshot(ctx, d.FromSnapshot)
		if err != nil {
			if errdefs.Is(err, errdefs.KindNotFound) {
				return DiffSide{}, "", forkFile{}, errdefs.Conflict(client.CodeSnapshotGone,
					"sandbox %s was made from snapshot %s, which was removed since: compare it with another sandbox (against)", sb.Name, d.FromSnapshot)
			}
			return DiffSide{}, "", forkFile{}, err
		}
		ff, err := f.savedForkFile(ctx, sn.SandboxID, sn.SandboxName)
		return DiffSide{Kind: "snapshot", ID: sn.ID, Name: sn.Name}, snapshotKey(sn.ID), ff, err
	}
	return DiffSide{Kind: "image", ID: sb.ImageDigest, Name: sb.Image}, "", forkFile{any: true}, nil
}

// savedForkFile is what the fork file of a saved copy (a checkpoint's, a
// snapshot's) of sandbox id may hold: that sandbox's identity, all of it
// while the sandbox is there, its id and name once it is removed; or no
// file, as a sandbox whose agent came before the fork contract had none.
func (f *Files) savedForkFile(ctx context.Context, id, name string) (forkFile, error) {
	sb, err := f.s.cfg.Store.GetSandbox(ctx, id)
	switch {
	case err == nil:
		return forkFile{want: bootIdentity(sb), absent: true}, nil
	case errdefs.Is(err, errdefs.KindNotFound):
		return forkFile{want: proto.Identity{ID: id, Name: name}, idOnly: true, absent: true}, nil
	}
	return forkFile{}, err
}

// slots bounds how many of a job run at once; the others wait, each until
// its context ends.
type slots struct {
	c       chan struct{}
	waiting atomic.Int32 // how many wait now
}

func newSlots(n int) *slots { return &slots{c: make(chan struct{}, n)} }

// acquire takes a slot, waiting for one until ctx ends (its error then);
// release gives it back.
func (s *slots) acquire(ctx context.Context) (release func(), err error) {
	select {
	case s.c <- struct{}{}:
		return func() { <-s.c }, nil
	default:
	}
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	select {
	case s.c <- struct{}{}:
		return func() { <-s.c }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// forkFile says what one side's /run/shard/fork may hold for the server to
// have written it, the diff leaving it out while it does (the fork
// contract's file differs between any two sandboxes by design; what else
// a sandbox puts there is its own, and shows). The agent writes the JSON
// of an Identity and a newline; a fork's adds the checkpoint it came from
// and when, which the server does not keep, so only the rest is checked.
type forkFile struct {
	want   proto.Identity
	idOnly bool // only want's ID and Name are known
	absent bool // no file is the server's too
	any    bool // whatever it holds (the image's)
}

func (ff forkFile) matcher() func(data []byte, present bool) bool {
	if ff.any {
		return nil
	}
	return ff.matches
}

func (ff forkFile) matches(data []byte, present bool) bool {
	if !present {
		return ff.absent
	}
	var id proto.Identity
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&id); err != nil {
		return false
	}
	if canon, err := json.Marshal(id); err != nil || !bytes.Equal(append(canon, '\n'), data) {
		return false // not as the agent writes it: another encoder's
	}
	if (id.Checkpoint == "") != id.ForkedAt.IsZero() {
		return false // a fork has both, a boot neither
	}
	w := ff.want
	if id.ID != w.ID || id.Name != w.Name {
		return false
	}
	return ff.idOnly || (id.ParentID == w.ParentID && id.ParentName == w.ParentName && id.Generation == w.Generation)
}
