package sandbox

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/sparse"
	"github.com/useshards/shard/internal/store"
)

// A checkpoint moves between the nodes of a cluster (a fork whose source's
// node has no room is restored on another) as one stream: a zstd-compressed
// tar of its record (checkpoint.json), its memory image (image/...) and its
// files (files.img, a filesystem image, mostly holes, which zstd squeezes
// and the receiver writes back sparse). The agent binary its memory maps is
// not sent: the receiving node must run the same shard build.

var checkpointID = regexp.MustCompile(`^[0-9a-f]{12}$`)

// ExportCheckpoint writes checkpoint id to w.
func (sv *Saved) ExportCheckpoint(ctx context.Context, id string, w io.Writer) error {
	release := sv.s.cks.use(id)
	defer release()
	ck, err := sv.s.cfg.Store.GetCheckpoint(ctx, id)
	if err != nil {
		return err
	}
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	doc, err := json.Marshal(ck)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "checkpoint.json", Mode: 0o600, Size: int64(len(doc))}); err != nil {
		return err
	}
	if _, err := tw.Write(doc); err != nil {
		return err
	}
	dir := sv.s.checkpointDir(id)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "image/" + rel + "/", Mode: 0o700})
		}
		return addFile(tw, p, "image/"+rel)
	})
	if err != nil {
		return fmt.Errorf("checkpoint %s's memory image: %w", id, err)
	}
	if err := addFile(tw, sv.s.cfg.Storage.SavedPath(checkpointKey(id)), "files.img"); err != nil {
		return fmt.Errorf("checkpoint %s's files: %w", id, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// addFile adds a regular file as its data extents (the records say where
// they go and the file's size), following a symlink the image may hold to
// where it was staged.
func addFile(tw *tar.Writer, p, name string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", name)
	}
	ext, err := sparse.Find(f, st.Size())
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: name, Mode: 0o600}
	sparse.Header(hdr, st.Size(), ext)
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	return sparse.ReadExtents(f, ext, tw)
}

// sparseOf reads a file entry's size and extents, which every file of the
// stream has.
func sparseOf(hdr *tar.Header) (int64, sparse.Extents, error) {
	size, ext, ok, err := sparse.FromHeader(hdr)
	if err == nil && !ok {
		err = fmt.Errorf("%s: no size", hdr.Name)
	}
	return size, ext, err
}

// ImportCheckpoint reads what ExportCheckpoint wrote (another node of the
// cluster, which signed the call) and records the checkpoint here under
// its id, pulling its image if this node lacks it. Everything in the
// stream is checked as if hostile: names, kinds, sizes.
func (sv *Saved) ImportCheckpoint(ctx context.Context, r io.Reader) (_ *store.Checkpoint, err error) {
	zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	ck, err := sv.receivable(ctx, tr)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if _, err := sv.s.cfg.Images.Ensure(ctx, ck.Image+"@"+ck.ImageDigest, nil); err != nil {
		if _, gerr := sv.s.cfg.Images.Get(ctx, ck.ImageDigest); gerr != nil {
			return nil, fmt.Errorf("image %s of checkpoint %s: %w", ck.Image, ck.ID, err)
		}
	}
	dir := sv.s.checkpointDir(ck.ID)
	key := checkpointKey(ck.ID)
	defer func() {
		if err != nil {
			provider.RemoveImage(dir)
			sv.s.cfg.Storage.RemoveSaved(key)
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	imageTook := time.Since(start)
	if err := sv.receiveFiles(tr, dir, key); err != nil {
		return nil, err
	}
	if err := sv.s.cfg.Store.ImportCheckpoint(project.Unscoped(ctx, "a checkpoint sent by another node keeps its own project"), ck); err != nil {
		return nil, err
	}
	sv.s.cfg.Log.Info("checkpoint received from another node", "checkpoint", ck.ID, "image_check", imageTook, "took", time.Since(start))
	return ck, nil
}

// badStream is a refusal of a checkpoint stream that is not what
// ExportCheckpoint writes.
func badStream(format string, a ...any) error {
	return errdefs.Invalid("checkpoint stream: "+format, a...)
}

// receivable reads the stream's checkpoint.json and checks that this node
// can take it: an id it does not hold, a provider that restores here, and
// the agent of this build.
func (sv *Saved) receivable(ctx context.Context, tr *tar.Reader) (*store.Checkpoint, error) {
	bad := badStream
	hdr, err := tr.Next()
	if err != nil || hdr.Name != "checkpoint.json" || hdr.Size > 1<<20 {
		return nil, bad("it must start with checkpoint.json")
	}
	var ck store.Checkpoint
	if err := json.NewDecoder(io.LimitReader(tr, hdr.Size)).Decode(&ck); err != nil {
		return nil, bad("checkpoint.json: %v", err)
	}
	if !checkpointID.MatchString(ck.ID) {
		return nil, bad("checkpoint id %q", ck.ID)
	}
	if _, err := sv.s.cfg.Store.GetCheckpoint(project.Unscoped(ctx, "a checkpoint id is unique on a node, whatever its project"), ck.ID); err == nil {
		return nil, errdefs.Conflict(client.CodeCheckpointExists, "checkpoint %s is already on this node", ck.ID)
	}
	if c, ok := sv.s.caps[ck.Provider]; !ok || !c.Available || !c.Checkpoint {
		return nil, errdefs.Unsupported("provider %s cannot restore on this node", ck.Provider)
	}
	// The memory image maps the agent binary: it must be this node's.
	agent := filepath.Join(filepath.Dir(sv.s.agentDir), filepath.Base(ck.AgentDir))
	if _, err := os.Stat(filepath.Join(agent, "shard")); err != nil {
		return nil, errdefs.Unsupported("checkpoint %s was taken under another shard build (agent %s) than this node runs: a fork moves only between nodes of one build", ck.ID, filepath.Base(ck.AgentDir))
	}
	ck.AgentDir = agent
	return &ck, nil
}

// receiveFiles reads the rest of the stream: the sandbox's files (into the
// store under key) and the memory image (into dir).
func (sv *Saved) receiveFiles(tr *tar.Reader, dir, key string) error {
	bad := badStream
	files := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return bad("%v", err)
		}
		name := path.Clean(hdr.Name)
		var size int64
		var ext sparse.Extents
		if hdr.Typeflag == tar.TypeReg {
			if size, ext, err = sparseOf(hdr); err != nil {
				return bad("%v", err)
			}
		}
		switch {
		case name == "files.img" && hdr.Typeflag == tar.TypeReg:
			if err := sv.s.cfg.Storage.Receive(key, size, ext, tr); err != nil {
				return err
			}
			files = true
		case strings.HasPrefix(name, "image/") && !strings.Contains(name, "..") && (hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeDir):
			p := filepath.Join(dir, strings.TrimPrefix(name, "image/"))
			if hdr.Typeflag == tar.TypeDir {
				if err := os.MkdirAll(p, 0o700); err != nil {
					return err
				}
				continue
			}
			if err := writeSparse(p, size, ext, tr); err != nil {
				return err
			}
		default:
			return bad("unexpected entry %q", hdr.Name)
		}
	}
	if !files {
		return bad("no files.img")
	}
	return nil
}

// writeSparse writes a new file at p of size bytes: ext's data from r, the
// rest holes.
func writeSparse(p string, size int64, ext sparse.Extents, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := sparse.WriteExtents(f, size, ext, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
