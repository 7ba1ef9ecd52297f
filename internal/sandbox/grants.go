package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"time"

	"github.com/useshards/shard/internal/agent/host"

	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// Access is what a sandbox may reach and hold: its secret grants (this
// file), its egress policy (policy.go), and the refused connections of
// its bound recorded in its ledger (conns.go).
type Access struct {
	s     *Service
	conns connRefusals // refused connections not yet in the ledger
}

// GrantRequest gives a secret to a sandbox: as the environment variable Env
// of every exec, or as the file File (written now, into its files).
type GrantRequest struct {
	Secret string
	Env    string
	File   string
}

// Grant gives a secret to a sandbox. An env grant applies to every exec
// from now on (the value is read at each exec, never stored in the sandbox's
// record or the ledger); a file grant writes the file into the running
// sandbox (mode 0400, root's). Granting the same secret again replaces the
// grant.
//
// A file grant never replaces what it did not write: a path that exists in
// the sandbox is refused (409 path_exists) unless this very grant (same
// secret, same path) wrote it and it is still that file, and so is a path
// another grant of the sandbox has. The agent in the sandbox resolves the
// path, following no symlink (409 path_unsafe for one on the way); the host
// never looks into the sandbox's files. Forks, restores and resumes copy
// the grants with the files, so the same holds there.
func (a *Access) Grant(ctx context.Context, idOrName string, req GrantRequest) (*store.Sandbox, error) {
	if a.s.cfg.Secrets == nil {
		return nil, errdefs.Unsupported("this server keeps no secrets")
	}
	if _, err := a.s.cfg.Secrets.Get(ctx, req.Secret); err != nil {
		return nil, err
	}
	switch {
	case req.Env != "" && req.File != "":
		return nil, errdefs.Invalid("grant %s as an env variable or as a file, not both", req.Secret)
	case req.File != "":
		if !filepath.IsAbs(req.File) || filepath.Clean(req.File) != req.File || req.File == "/" {
			return nil, errdefs.Invalid("file %q must be a clean absolute path", req.File)
		}
	default:
		if req.Env == "" {
			req.Env = req.Secret
		}
		if names.EnvName(req.Env) != nil { // also for a grant a resume makes again from an old ledger
			return nil, errdefs.Invalid("%q is not an environment variable name: give one with --env, or grant it as a file with --file", req.Env)
		}
	}
	sb, unlock, err := a.s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := a.s.adm.ledgerRoom(ctx, sb.Project, "grant secret "+req.Secret+" to sandbox "+sb.Name); err != nil {
		return nil, err
	}
	old := grantOf(sb, req.Secret)
	if req.File != "" || (old != nil && old.File != "") {
		if sb.State != StateRunning {
			return nil, errdefs.Conflict(client.CodeSandboxNotRunning, "sandbox %s is %s: a file grant is written into (and removed from) a running sandbox: start it first", sb.Name, sb.State)
		}
	}
	g := store.Grant{Secret: req.Secret, Env: req.Env, File: req.File, At: time.Now().UTC()}
	if req.File != "" {
		g.Env = ""
		for _, o := range sb.Grants {
			if o.File == req.File && o.Secret != req.Secret {
				return nil, errdefs.Conflict(client.CodePathExists, "%s in sandbox %s is the file of its grant of secret %s: ungrant that first, or grant to another path", req.File, sb.Name, o.Secret)
			}
		}
		owns := old != nil && old.File == req.File
		if owns {
			g.Dirs = old.Dirs
		}
		if err := a.canGrantFiles(ctx, sb); err != nil {
			return nil, err
		}
		value, err := a.s.cfg.Secrets.Value(ctx, req.Secret)
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := a.s.agentFor(sb).Do(cctx, proto.Request{Op: proto.OpGrantFile, Path: req.File, Data: value, Mode: grantFileMode, Replace: owns})
		cancel()
		if err != nil {
			return nil, fileOpError(sb, "write", req.File, r, err)
		}
		if !owns {
			g.Dirs = r.Made
		}
	}
	if old != nil && old.File != "" && old.File != req.File {
		if err := a.removeFile(ctx, sb, old); err != nil {
			if req.File != "" { // as it was: the new file goes again
				a.removeFile(ctx, sb, &g)
			}
			return nil, err
		}
	}
	return a.s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
		r.Grants = slices.DeleteFunc(r.Grants, func(x store.Grant) bool { return x.Secret == req.Secret })
		r.Grants = append(r.Grants, g)
		return &store.EventSpec{Type: ledger.SecretGranted, Data: ledger.GrantData{Secret: g.Secret, Env: g.Env, File: g.File}}, nil
	})
}

// Ungrant takes a secret away from a sandbox: new execs no longer get the
// variable; a granted file is removed. Its forks keep their own grants.
func (a *Access) Ungrant(ctx context.Context, idOrName, secret string) (*store.Sandbox, error) {
	sb, unlock, err := a.s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	g := grantOf(sb, secret)
	if g == nil {
		return nil, errdefs.NotFound(client.CodeGrantNotFound, "sandbox %s has no grant of secret %s", sb.Name, secret)
	}
	if g.File != "" {
		if sb.State != StateRunning {
			return nil, errdefs.Conflict(client.CodeSandboxNotRunning, "sandbox %s is %s: a file grant is removed from a running sandbox: start it first", sb.Name, sb.State)
		}
		if err := a.removeFile(ctx, sb, g); err != nil {
			return nil, err
		}
	}
	return a.s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
		r.Grants = slices.DeleteFunc(r.Grants, func(x store.Grant) bool { return x.Secret == secret })
		return &store.EventSpec{Type: ledger.SecretUngranted, Data: ledger.SecretUngrantedData{Secret: secret}}, nil
	})
}

// grantFileMode is a granted file's mode.
const grantFileMode = 0o400

// removeFile removes the file of grant g from the sandbox, if it is still
// the file the grant wrote (the agent checks, following no symlink), and
// the directories the grant made that are empty. What the sandbox put in
// its place is left there, and logged.
func (a *Access) removeFile(ctx context.Context, sb *store.Sandbox, g *store.Grant) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := a.s.agentFor(sb).Do(cctx, proto.Request{Op: proto.OpUngrantFile, Path: g.File, Mode: grantFileMode, Dirs: g.Dirs})
	if err != nil {
		return fileOpError(sb, "remove", g.File, r, err)
	}
	if r.Left != "" {
		a.s.cfg.Log.Warn("ungrant: a granted file was not removed", "sandbox", sb.ID, "secret", g.Secret, "why", r.Left)
	}
	return nil
}

// fileOpError maps a failed grant file op (r: the agent's reply, if it
// answered) to an API error.
func fileOpError(sb *store.Sandbox, verb, path string, r *proto.Reply, err error) error {
	if r != nil {
		switch r.Code {
		case proto.CodePathExists:
			return errdefs.Conflict(client.CodePathExists, "%s in sandbox %s: a file grant does not replace what it did not write: grant to another path, or remove it in the sandbox first", r.Error, sb.Name)
		case proto.CodePathUnsafe:
			return errdefs.Conflict(client.CodePathUnsafe, "%s in sandbox %s", r.Error, sb.Name)
		}
		if errors.Is(err, host.ErrUnsupported) {
			return noFileGrants(sb)
		}
		return errdefs.Upstream(client.CodeGrantFailed, "%s %s in sandbox %s: %s", verb, path, sb.Name, r.Error)
	}
	return errdefs.Upstream(client.CodeGrantFailed, "%s %s in sandbox %s: %v", verb, path, sb.Name, err)
}

// canGrantFiles checks that sb's agent has the grant file ops before a
// secret is sent to it. An agent from before caps is taken to (see
// proto.LegacyCaps); if it is older still, its refusal says so.
func (a *Access) canGrantFiles(ctx context.Context, sb *store.Sandbox) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	caps, err := a.s.agentFor(sb).Caps(cctx)
	if err != nil {
		return errdefs.Upstream(client.CodeGrantFailed, "sandbox %s does not answer: %v", sb.Name, err)
	}
	if !caps.Has(proto.CapGrantFile) {
		return noFileGrants(sb)
	}
	return nil
}

// noFileGrants is the refusal of a file grant by an agent without the ops.
func noFileGrants(sb *store.Sandbox) error {
	return errdefs.Unsupported("the agent of sandbox %s predates safe file grants: stop and start the sandbox to update it", sb.Name)
}

func grantOf(sb *store.Sandbox, secret string) *store.Grant {
	for i := range sb.Grants {
		if sb.Grants[i].Secret == secret {
			return &sb.Grants[i]
		}
	}
	return nil
}

// grantEnv resolves a sandbox's env grants into K=V for an exec. A secret
// removed since its grant gives nothing.
func (a *Access) grantEnv(ctx context.Context, sb *store.Sandbox) ([]string, error) {
	ctx = inProject(ctx, sb) // its secrets are its project's
	var out []string
	for _, g := range sb.Grants {
		if g.Env == "" || a.s.cfg.Secrets == nil {
			continue
		}
		v, err := a.s.cfg.Secrets.Value(ctx, g.Secret)
		if errdefs.Is(err, errdefs.KindNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, g.Env+"="+string(v))
	}
	return out, nil
}

// inProject scopes ctx to sb's project: what sb names (secrets,
// environments) is looked up there, whoever asks.
func inProject(ctx context.Context, sb *store.Sandbox) context.Context {
	return project.With(ctx, project.OrDefault(sb.Project))
}

func copyGrants(g []store.Grant) []store.Grant { return slices.Clone(g) }

func copyPolicy(p *store.Policy) *store.Policy {
	if p == nil {
		return nil
	}
	return &store.Policy{DenyAll: p.DenyAll, Allow: slices.Clone(p.Allow), Deny: slices.Clone(p.Deny)}
}
