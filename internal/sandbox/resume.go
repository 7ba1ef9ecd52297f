package sandbox

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/useshards/shard/internal/project"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// Sessions is what the service does with ledger sessions: a resume makes
// a sandbox again from one (this file), and a removal, by hand or past the
// ledger's retention, takes one away (ledgersweep.go).
type Sessions struct{ s *Service }

// Replayed is one exec a resume ran again.
type Replayed struct {
	Argv         []string
	RecordedExit *int // nil: it never finished in the resumed session
	ExitCode     *int // nil: started again and left running
	Error        string
}

// Reapplied is one grant or policy change a resume made again.
type Reapplied struct {
	Event  string // ledger.SecretGranted, ...
	Secret string // for the grant events
	Error  string
}

// ResumeResult is what a resume made and did.
type ResumeResult struct {
	Sandbox    *store.Sandbox
	Checkpoint string // empty: made fresh from the session's sandbox.created
	Replayed   []Replayed
	Reapplied  []Reapplied
}

// Resume recreates a sandbox from a ledger session: from its latest
// checkpoint that still exists (or, with none, as its sandbox was first
// made), then it replays the execs the ledger recorded after that point, in
// order. An exec that ended is run again and waited for, whatever its code;
// one that never ended is started and left running; stdin and per-exec env
// values are not in the ledger, so a replayed exec gets neither. Grants and
// policy changes recorded after that point are made again too, in their
// place among the execs (a replayed exec gets the grants of its moment); one
// that fails (its secret was removed since) is reported, and replay goes on.
// The new sandbox has a new id and its own session, where the replay is
// recorded.
//
// allow, if not nil, is asked first whether the new sandbox may carry
// secret grants and a network policy, as the session's checkpoints or its
// later events may give it (the API checks the caller's scopes there).
func (ss *Sessions) Resume(ctx context.Context, session, name string, allow Allow) (*ResumeResult, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if _, err := ss.s.cfg.Store.GetSession(ctx, session); err != nil {
		return nil, err
	}
	if err := ss.s.adm.ledgerRoom(ctx, project.Of(ctx), "resume ledger session "+session); err != nil {
		return nil, err
	}
	events, err := ss.sessionEvents(ctx, session)
	if err != nil {
		return nil, err
	}
	if allow != nil {
		if err := ss.allowCarried(ctx, session, events, allow); err != nil {
			return nil, err
		}
	}
	plan, err := ledger.PlanResume(events, func(id string) bool {
		_, err := ss.s.cfg.Store.GetCheckpoint(ctx, id)
		return err == nil
	})
	if err != nil {
		return nil, errdefs.Conflict(client.CodeSessionUnusable, "ledger session %s cannot be resumed: %v", session, err)
	}
	res := &ResumeResult{Checkpoint: plan.Checkpoint}
	if res.Sandbox, err = ss.resumeStart(ctx, plan, session, name, allow); err != nil {
		return nil, err
	}
	ss.replay(ctx, res, plan)
	ss.s.cfg.Log.Info("resumed", "session", session, "sandbox", res.Sandbox.ID, "checkpoint", plan.Checkpoint, "replayed", len(res.Replayed), "reapplied", len(res.Reapplied))
	return res, nil
}

// sessionEvents reads every event of session.
func (ss *Sessions) sessionEvents(ctx context.Context, session string) ([]store.Event, error) {
	var events []store.Event
	for after := int64(0); ; {
		page, err := ss.s.cfg.Store.Events(ctx, session, after, 1000)
		if err != nil {
			return nil, err
		}
		events = append(events, page...)
		if len(page) < 1000 {
			return events, nil
		}
		after = page[len(page)-1].Seq
	}
}

// allowCarried asks allow whether the resumed sandbox may carry the grants
// and policy the session's checkpoints or its events may give it.
func (ss *Sessions) allowCarried(ctx context.Context, session string, events []store.Event, allow Allow) error {
	cks, err := ss.s.cfg.Store.ListCheckpoints(ctx, session)
	if err != nil {
		return err
	}
	grants, policy := ledger.Carries(events)
	for _, ck := range cks {
		grants = grants || len(ck.Grants) > 0
		policy = policy || ck.Policy != nil
	}
	return allow(grants, policy)
}

// resumeStart makes the sandbox a resume replays into: a restore of the
// plan's checkpoint, or, with none, a create as the session's first
// sandbox.created says.
//
// The checkpoint may be another session's (a fork's session starts from its
// source's): allow is asked about it too, with it held.
func (ss *Sessions) resumeStart(ctx context.Context, plan ledger.Plan, session, name string, allow Allow) (*store.Sandbox, error) {
	var sb *store.Sandbox
	var err error
	switch {
	case plan.Checkpoint != "":
		sb, err = ss.s.saved.Restore(ctx, plan.Checkpoint, RestoreOptions{Name: name, ResumedFrom: session, Allow: allow})
	case plan.Created.Checkpoint != "":
		return nil, errdefs.Conflict(client.CodeCheckpointGone, "ledger session %s started from checkpoint %s, which was removed, and has no later checkpoint: there is nothing to resume from (a fork's checkpoint goes with the last sandbox that needs it, unless the fork was made with --keep-checkpoint)", session, plan.Created.Checkpoint)
	default:
		c := plan.Created
		sb, err = ss.s.Create(ctx, CreateRequest{
			Name: name, Image: c.Image, Digest: c.Digest, Bounds: c.Bounds,
			Provider: c.Provider, FromSnapshot: c.FromSnapshot, ResumedFrom: session,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("resume %s: %w", session, err)
	}
	return sb, nil
}

// replay runs the plan's execs again in res.Sandbox, in order, with its
// grant and policy changes made again in their places among them.
func (ss *Sessions) replay(ctx context.Context, res *ResumeResult, plan ledger.Plan) {
	changes := plan.Changes
	reapply := func(before int64) {
		for len(changes) > 0 && changes[0].Seq < before {
			res.Reapplied = append(res.Reapplied, ss.reapply(ctx, res, changes[0]))
			changes = changes[1:]
		}
	}
	for _, pe := range plan.Execs {
		reapply(pe.Seq)
		res.Replayed = append(res.Replayed, ss.replayExec(ctx, res.Sandbox, pe))
	}
	reapply(math.MaxInt64)
}

// replayExec runs one planned exec again: waited for if it ended in the
// session, else started and left running.
func (ss *Sessions) replayExec(ctx context.Context, sb *store.Sandbox, pe ledger.PlannedExec) Replayed {
	r := Replayed{Argv: pe.Started.Argv}
	if pe.Ended() && pe.Finished.ExitCode != nil {
		r.RecordedExit = pe.Finished.ExitCode
	}
	req := ExecRequest{Argv: pe.Started.Argv, Workdir: pe.Started.Cwd, User: pe.Started.User, Timeout: time.Duration(pe.Started.TimeoutMS) * time.Millisecond}
	// Granted secrets, as any exec gets them (values are never in the
	// ledger, names are not recorded in the exec either).
	if genv, err := ss.s.access.grantEnv(ctx, sb); err == nil {
		req.Env = genv
	}
	started := ledger.ExecStartedData{Argv: req.Argv, Cwd: req.Workdir, User: req.User, TimeoutMS: pe.Started.TimeoutMS, Replay: true}
	if !pe.Ended() {
		sess, _, err := ss.s.exec(ctx, sb, req, started)
		if err != nil {
			r.Error = err.Error()
		} else {
			sess.Close() // it runs on; its end is recorded when it comes
		}
		return r
	}
	code, err := ss.s.runReq(ctx, sb, req, started, io.Discard)
	if err != nil {
		r.Error = err.Error()
	} else {
		r.ExitCode = &code
	}
	return r
}

// reapply makes one grant or policy change again on res.Sandbox, and keeps
// its record (with the grants a later exec gets) current.
func (ss *Sessions) reapply(ctx context.Context, res *ResumeResult, c ledger.PlannedChange) Reapplied {
	r := Reapplied{Event: c.Type, Secret: c.Grant.Secret}
	var sb *store.Sandbox
	var err error
	switch c.Type {
	case ledger.SecretGranted:
		sb, err = ss.s.access.Grant(ctx, res.Sandbox.ID, GrantRequest{Secret: c.Grant.Secret, Env: c.Grant.Env, File: c.Grant.File})
	case ledger.SecretUngranted:
		sb, err = ss.s.access.Ungrant(ctx, res.Sandbox.ID, c.Grant.Secret)
	case ledger.PolicySet:
		sb, err = ss.s.access.SetPolicy(ctx, res.Sandbox.ID, c.Policy)
	case ledger.PolicyCleared:
		sb, err = ss.s.access.SetPolicy(ctx, res.Sandbox.ID, nil)
	}
	if err != nil {
		r.Error = err.Error()
	} else if sb != nil {
		res.Sandbox = sb
	}
	return r
}
