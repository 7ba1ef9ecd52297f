package crossnode

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/peer"
	"github.com/useshards/shard/internal/revert"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
)

// Fork forks src onto node to, chosen because src's node has no room: src
// is checkpointed here, the checkpoint sent to to, req.Count forks
// restored there from it (their ledgers say from_node), and then the
// checkpoint removed from both nodes. A failure removes what was made:
// the forks restored already, and both checkpoints.
func (s *Service) Fork(ctx context.Context, src *store.Sandbox, req sandbox.ForkRequest, to Restorer) ([]client.Sandbox, error) {
	self := s.Records.Name()
	if req.Hooks.InSource {
		return nil, errdefs.Unsupported("fork of %s: node %s has no room for it, and hooks_in_source is not available for a fork that moves to another node", src.Name, self)
	}
	start := time.Now()
	ck, err := s.Checkpoints.Checkpoint(ctx, src.ID, req.Tag)
	if err != nil {
		return nil, err
	}
	// The checkpoints go whichever way the fork ends: the forks restored
	// from them do not need them.
	bg := context.WithoutCancel(ctx)
	defer s.undo("checkpoint "+ck.ID, func() error { return s.Checkpoints.RemoveCheckpoint(bg, ck.ID) })()
	frozen := time.Since(start)
	moved, err := s.Send(ctx, to, ck.ID, nil)
	if err != nil {
		return nil, err
	}
	sent := time.Since(start)
	defer s.undo("checkpoint "+ck.ID+" on node "+to.Name(), func() error { return to.RemoveCheckpoint(bg, ck.ID) })()

	r := revert.New()
	defer r.Fail()
	hooks := peer.Hooks{FromNode: self, Timeout: req.Hooks.Timeout, Ignore: req.Hooks.Ignore}
	forks := make([]client.Sandbox, 0, req.Count)
	for i := range req.Count {
		name := req.Name
		if req.Count > 1 && name != "" {
			name = fmt.Sprintf("%s-%d", req.Name, i+1)
		}
		sb, err := to.Restore(ctx, ck.ID, client.RestoreRequest{Name: name}, hooks)
		if err != nil {
			return nil, fmt.Errorf("fork of %s on node %s: %w", src.Name, to.Name(), err)
		}
		r.Add(s.undo("fork "+sb.ID+" on node "+to.Name(), func() error { return to.RemoveSandbox(bg, sb.ID) }))
		forks = append(forks, *sb)
	}
	r.Success()
	s.Log.Info("fork moved to another node", "source", src.ID, "node", to.Name(), "checkpoint", ck.ID,
		"checkpoint_took", frozen, "sent_bytes", moved, "sent_took", sent-frozen, "total", time.Since(start))
	return forks, nil
}

// Send streams checkpoint id to node to (with q for the receiver:
// environment=) and returns the bytes sent. A checkpoint of a sandbox
// made from an imported image names it (image=): the receiver copies the
// import first if it lacks it. The checkpoint is read no more once Send
// returns, so the caller may remove it.
func (s *Service) Send(ctx context.Context, to Receiver, id string, q url.Values) (int64, error) {
	if ck, err := s.Checkpoints.GetCheckpoint(ctx, id); err == nil {
		if _, ok := image.ImportName(ck.Image); ok {
			q = cloneValues(q)
			q.Set("image", ck.Image)
		}
	}
	pr, pw := io.Pipe()
	exported := make(chan struct{})
	go func() {
		defer close(exported)
		pw.CloseWithError(s.Checkpoints.ExportCheckpoint(ctx, id, pw))
	}()
	// The exporter reads the checkpoint: it must be done before the caller
	// removes it, whichever way the send ends.
	defer func() {
		pr.CloseWithError(io.ErrClosedPipe)
		<-exported
	}()
	counted := &countingReader{r: pr}
	if err := to.SendCheckpoint(ctx, counted, q); err != nil {
		return 0, fmt.Errorf("send checkpoint %s to node %s: %w", id, to.Name(), err)
	}
	return counted.n, nil
}

func cloneValues(q url.Values) url.Values {
	out := url.Values{}
	for k, v := range q {
		out[k] = append([]string(nil), v...)
	}
	return out
}
