package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/fsdiff"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/oci"
	"github.com/useshards/shard/internal/store"
)

// serverPaths are what the server itself puts in every sandbox's files,
// left out of diffs by exact path: the agent's mount point and binary, the
// host files it binds over, and the fork contract's file with its
// directory (each fork's own identity, different by design). Anything else
// under /.shard or /run/shard is the sandbox's own, and shows: it persists
// across stop and start and reaches forks and snapshots like any file.
var serverPaths = []string{oci.AgentDir, oci.AgentPath, "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", path.Dir(proto.ForkFile), proto.ForkFile}

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
func (f *Files) Diff(ctx context.Context, idOrName string, o DiffOptions) (*DiffResult, error) {
	to, err := f.s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	res := &DiffResult{To: DiffSide{Kind: "sandbox", ID: to.ID, Name: to.Name}}
	var from *store.Sandbox
	key := "" // a saved copy's, for the from side
	if o.Against != "" {
		if from, err = f.s.cfg.Store.GetSandbox(ctx, o.Against); err != nil {
			return nil, err
		}
		if from.ImageDigest != to.ImageDigest {
			return nil, errdefs.New(errdefs.KindInvalid, client.CodeDifferentImages,
				"sandbox %s is of image %s and %s of %s: a diff compares sandboxes of one image (a lineage)", from.Name, from.Image, to.Name, to.Image)
		}
		res.From = DiffSide{Kind: "sandbox", ID: from.ID, Name: from.Name}
	} else {
		if res.From, key, err = f.startedFrom(ctx, to); err != nil {
			return nil, err
		}
	}
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
	r, err := fsdiff.Diff(fsdiff.Tree{Upper: fromUpper}, fsdiff.Tree{Upper: filepath.Join(toDir, "upper")}, img.Layers, fsdiff.Options{Patch: o.Patch, Skip: serverPaths})
	if err != nil {
		return nil, err
	}
	res.Result = r
	return res, nil
}

// startedFrom is what sb started from (see Diff), and the key of its saved
// files (none for the image).
func (f *Files) startedFrom(ctx context.Context, sb *store.Sandbox) (DiffSide, string, error) {
	evs, err := f.s.cfg.Store.Events(ctx, sb.Session, 0, 1)
	if err != nil {
		return DiffSide{}, "", err
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
				return DiffSide{}, "", errdefs.Conflict(client.CodeCheckpointGone,
					"sandbox %s started from checkpoint %s, which was removed since: compare it with another sandbox (against)", sb.Name, d.Checkpoint)
			}
			return DiffSide{}, "", err
		}
		return DiffSide{Kind: "checkpoint", ID: ck.ID, Name: ck.SandboxName}, checkpointKey(ck.ID), nil
	case d.FromSnapshot != "":
		sn, err := f.s.cfg.Store.GetSnapshot(ctx, d.FromSnapshot)
		if err != nil {
			if errdefs.Is(err, errdefs.KindNotFound) {
				return DiffSide{}, "", errdefs.Conflict(client.CodeSnapshotGone,
					"sandbox %s was made from snapshot %s, which was removed since: compare it with another sandbox (against)", sb.Name, d.FromSnapshot)
			}
			return DiffSide{}, "", err
		}
		return DiffSide{Kind: "snapshot", ID: sn.ID, Name: sn.Name}, snapshotKey(sn.ID), nil
	}
	return DiffSide{Kind: "image", ID: sb.ImageDigest, Name: sb.Image}, "", nil
}
