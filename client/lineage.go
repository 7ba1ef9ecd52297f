package client

import (
	"context"
	"net/url"
	"time"
)

// TreeNode is one object of the fork tree and what came from it.
type TreeNode struct {
	Kind     string     `json:"kind"` // sandbox, checkpoint, snapshot, environment
	ID       string     `json:"id"`   // an environment's name
	Name     string     `json:"name,omitempty"`
	State    string     `json:"state"` // a sandbox's state, or removed; kept or removed for the others
	Removed  bool       `json:"removed"`
	At       time.Time  `json:"at"`
	Via      string     `json:"via,omitempty"` // how it came from its parent (fork, restore, environment, resume, snapshot; a checkpoint's kind)
	Image    string     `json:"image,omitempty"`
	Provider string     `json:"provider,omitempty"`
	Children []TreeNode `json:"children,omitempty"`
	// RemovedSandboxes are the removed sandboxes that came straight from
	// it, left out of a tree asked for without all (nothing live is below
	// them): why a kept checkpoint whose forks or restores were all
	// removed is there.
	RemovedSandboxes []TreeNode `json:"removed_sandboxes,omitempty"`
}

// Tree is the fork tree of the project: with sandbox, the lineage it is in;
// without, every lineage. all keeps what was removed and has nothing live
// below it.
func (c *Client) Tree(ctx context.Context, sandbox string, all bool) ([]TreeNode, error) {
	p := "/tree"
	if sandbox != "" {
		p = "/sandboxes/" + esc(sandbox) + "/tree"
	}
	if all {
		p += "?all=true"
	}
	var out struct {
		Roots []TreeNode `json:"roots"`
	}
	err := c.call(ctx, "GET", p, nil, &out)
	return out.Roots, err
}

// DiffSide names one side of a diff.
type DiffSide struct {
	Kind string `json:"kind"` // sandbox, checkpoint, snapshot, image
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
}

// Change is one path that differs.
type Change struct {
	Path  string   `json:"path"`
	Kind  string   `json:"kind"` // added, removed, changed
	Type  string   `json:"type"`
	What  []string `json:"what,omitempty"` // changed: content, type, mode, owner, target
	SizeA int64    `json:"size_a"`
	SizeB int64    `json:"size_b"`
	Patch string   `json:"patch,omitempty"`
	// NotCompared is what the server could not tell ("content": the
	// diff's read bound came first): the file may differ there or not.
	NotCompared []string `json:"not_compared,omitempty"`
	// PathBytes is the path's bytes when they are not UTF-8 (Path then
	// has U+FFFD for each byte that is not).
	PathBytes []byte `json:"path_bytes,omitempty"`
}

// Diff is what changed from From to To.
type Diff struct {
	From    DiffSide `json:"from"`
	To      DiffSide `json:"to"`
	Changes []Change `json:"changes"`
	Added   int      `json:"added"`
	Removed int      `json:"removed"`
	Changed int      `json:"changed"`
	// Truncated: not every change is listed (more than 20000 changes, more
	// than 1048576 directory entries to read, or a path longer than the
	// server looks up).
	Truncated bool `json:"truncated"`
	// NotCompared counts the changes (of Changed) whose content was not
	// compared: the diff's read bound came first.
	NotCompared int `json:"not_compared"`
}

// Diff lists what changed in sandbox's files since against (another
// sandbox of its image), or, with against "", since it started (the
// checkpoint it was forked or restored from, its snapshot, or its image).
// patch adds unified diffs of changed text files.
func (c *Client) Diff(ctx context.Context, sandbox, against string, patch bool) (*Diff, error) {
	q := url.Values{}
	if against != "" {
		q.Set("against", against)
	}
	if patch {
		q.Set("patch", "true")
	}
	var out Diff
	if err := c.call(ctx, "GET", "/sandboxes/"+esc(sandbox)+"/diff?"+q.Encode(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
