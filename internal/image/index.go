package image

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

const indexFile = "index.json"

// index is what the store knows, persisted as index.json. Blobs and layer
// dirs on disk are only trusted when the index mentions them: a crash
// between writing one and recording it leaves garbage that Open collects,
// never a half-written layer in use.
type index struct {
	Version int                     `json:"version"`
	Refs    map[string]*refRecord   `json:"refs"`   // canonical reference -> what it resolved to
	Images  map[string]*imageRecord `json:"images"` // manifest digest -> image
	Layers  map[string]*layerRecord `json:"layers"` // diffID -> unpacked dir
}

type refRecord struct {
	Digest   string    `json:"digest"`   // what the reference resolved to: an index or a manifest
	Manifest string    `json:"manifest"` // the platform manifest; key of index.Images
	Created  time.Time `json:"created"`  // when first pulled or imported under this reference
	// Origin is the node of a cluster an import was copied from on its
	// first use here ("" for an import made here, and a pulled image).
	Origin string `json:"origin,omitempty"`
}

type imageRecord struct {
	Config string   `json:"config"` // config blob digest, the image ID
	Layers []string `json:"layers"` // diffIDs, bottom first
	Spec   Config   `json:"spec"`
	// Blobs are the layer blobs an import gave, kept as it gave them (in
	// blobs/, by digest, in the manifest's order), so that the image can
	// be sent to another node of a cluster exactly as it was imported.
	// Pulled images and copies keep none.
	Blobs []string `json:"blobs,omitempty"`
}

type layerRecord struct {
	Dir     string   `json:"dir"`               // name under <Dir>/l
	Size    int64    `json:"size"`              // bytes of file content
	TarSize int64    `json:"tarSize"`           // bytes of the uncompressed tar (for synthesized manifests)
	Format  int      `json:"format,omitempty"`  // layerFormat of the unpacker that made Dir (0: the first)
	Devices []Device `json:"devices,omitempty"` // device nodes of the layer, not created in Dir
}

func loadIndex(path string) (*index, error) {
	idx := &index{Version: 1}
	b, err := os.ReadFile(path)
	switch {
	case os.IsNotExist(err):
	case err != nil:
		return nil, fmt.Errorf("read image index: %w", err)
	default:
		if err := json.Unmarshal(b, idx); err != nil {
			return nil, fmt.Errorf("image index %s is corrupt: %w", path, err)
		}
	}
	if idx.Refs == nil {
		idx.Refs = map[string]*refRecord{}
	}
	if idx.Images == nil {
		idx.Images = map[string]*imageRecord{}
	}
	if idx.Layers == nil {
		idx.Layers = map[string]*layerRecord{}
	}
	return idx, nil
}

func (s *Store) saveLocked() error {
	b, err := json.MarshalIndent(s.idx, "", " ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(s.path(indexFile), b); err != nil {
		return s.storeErr("save its index", err)
	}
	return nil
}

// writeFileAtomic writes via a temp file and rename, so readers (and a
// restart after a crash) see the old content or the new, never a mix.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o600) // only root reads the store
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// writeBlob stores content under its digest unless already there.
func (s *Store) writeBlob(digest string, data []byte) error {
	p := s.blobPath(digest)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if err := writeFileAtomic(p, data); err != nil {
		return s.storeErr("store a blob", err)
	}
	return nil
}

func (s *Store) blobPath(digest string) string {
	return s.path("blobs", "sha256", trimAlgo(digest))
}

func trimAlgo(digest string) string {
	if len(digest) > 7 && digest[:7] == "sha256:" {
		return digest[7:]
	}
	return digest
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// gcLocked drops images no reference uses, then layers and blobs no image
// uses, sparing what in-flight pulls have pinned. Layer dirs are moved
// into tmp/ (so the name is free at once) and returned for the caller to
// delete after releasing the lock. The index is saved if anything changed
// or the caller says it already has (dirty).
func (s *Store) gcLocked(dirty bool) ([]string, error) {
	usedImages, usedBlobs, usedLayers := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, rr := range s.idx.Refs {
		usedImages[rr.Manifest] = true
		usedBlobs[rr.Digest] = true
	}
	changed := dirty
	for m, im := range s.idx.Images {
		if !usedImages[m] && s.pins[m] == 0 {
			delete(s.idx.Images, m)
			changed = true
			continue
		}
		usedBlobs[m], usedBlobs[im.Config] = true, true
		for _, b := range im.Blobs {
			usedBlobs[b] = true
		}
		for _, l := range im.Layers {
			usedLayers[l] = true
		}
	}
	var trash []string
	known := map[string]bool{}
	for d, lr := range s.idx.Layers {
		if usedLayers[d] || s.pins[d] > 0 {
			known[lr.Dir] = true
			continue
		}
		delete(s.idx.Layers, d)
		changed = true
	}
	// Dirs under l/ that no record keeps: just freed, or left by a crash.
	if ents, err := os.ReadDir(s.path("l")); err == nil {
		for _, e := range ents {
			if !known[e.Name()] {
				if p := s.trashLocked(s.path("l", e.Name())); p != "" {
					trash = append(trash, p)
				}
			}
		}
	}
	if ents, err := os.ReadDir(s.path("blobs", "sha256")); err == nil {
		for _, e := range ents {
			d := "sha256:" + e.Name()
			if hex64.MatchString(e.Name()) && !usedBlobs[d] && s.pins[d] == 0 {
				_ = os.Remove(s.blobPath(d))
			}
		}
	}
	if !changed {
		return trash, nil
	}
	return trash, s.saveLocked()
}

// trashLocked moves p into tmp/ so that it can be deleted slowly, outside
// the lock, while its old name is already free for a new unpack.
func (s *Store) trashLocked(p string) string {
	t, err := os.MkdirTemp(s.path("tmp"), "rm-")
	if err != nil {
		return ""
	}
	if err := os.Rename(p, t); err != nil {
		_ = os.Remove(t)
		_ = os.RemoveAll(p) // not a dir (rename onto a dir fails): small, remove now
		return ""
	}
	return t
}
