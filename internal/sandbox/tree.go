package sandbox

import (
	"context"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/lineage"
)

// Tree is the fork tree of the caller's project (lineage.Build): every
// lineage, or with idOrName the one that sandbox is in. Without all,
// what was removed and has nothing live below it is left out (a removed
// sandbox is named by what it came from: lineage.Prune).
func (f *Files) Tree(ctx context.Context, idOrName string, all bool) ([]*lineage.Node, error) {
	st := f.s.cfg.Store
	var in lineage.Input
	var err error
	if in.Events, err = st.LineageEvents(ctx); err != nil {
		return nil, err
	}
	if in.Sandboxes, err = st.ListSandboxes(ctx); err != nil {
		return nil, err
	}
	if in.Checkpoints, err = st.ListCheckpoints(ctx, ""); err != nil {
		return nil, err
	}
	if in.Snapshots, err = st.ListSnapshots(ctx); err != nil {
		return nil, err
	}
	if in.Environments, err = st.ListEnvironments(ctx); err != nil {
		return nil, err
	}
	roots := lineage.Build(in)
	if !all {
		roots = lineage.Prune(roots)
	}
	if idOrName == "" {
		return roots, nil
	}
	sb, err := st.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	n := lineage.Find(roots, lineage.KindSandbox, sb.ID)
	if n == nil {
		return nil, errdefs.NotFound(client.CodeSandboxNotFound, "sandbox %s is in no lineage the ledger knows", sb.Name)
	}
	return []*lineage.Node{lineage.Root(n)}, nil
}
