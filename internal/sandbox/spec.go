package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/envlist"

	"github.com/useshards/shard/internal/oci"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/store"
)

// sandboxHostname is a sandbox's host name: its name, when that is a valid
// one, else its id.
func sandboxHostname(sb *store.Sandbox) string {
	if !hostnameOK(sb.Name) {
		return sb.ID
	}
	return sb.Name
}

// hostnameOK says whether a sandbox's name can be its hostname (else its
// id is).
func hostnameOK(name string) bool {
	return len(name) <= 63 && !strings.ContainsAny(name, "_.")
}

// writeHostFiles writes /etc/hosts and /etc/hostname of a staged sandbox
// again, in place (they are bind mounts of these files), for its name now
// (a warm spare's or a sandbox made ahead's were written for its id).
func (s *Service) writeHostFiles(sb *store.Sandbox) error {
	for n, b := range hostFiles(sb) {
		if err := oci.WriteFile(filepath.Join(s.runDir(sb.ID), n), b); err != nil {
			return err
		}
	}
	return nil
}

// hostFiles are the contents of the sandbox's /etc/hosts and /etc/hostname
// (bind mounts of files of these names in its run directory).
func hostFiles(sb *store.Sandbox) map[string][]byte {
	h := sandboxHostname(sb)
	return map[string][]byte{
		"hosts":    []byte(fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", sb.IP, h)),
		"hostname": []byte(h + "\n"),
	}
}

// instance writes the small files a sandbox mounts and builds its spec.
func (s *Service) instance(sb *store.Sandbox, rootfsDir, nsPath string) (*provider.Instance, error) {
	dir := s.runDir(sb.ID)
	hostname := sandboxHostname(sb)
	files := hostFiles(sb)
	files["resolv.conf"] = s.cfg.Net.ResolvConf()
	for n, b := range files {
		if err := oci.WriteFile(filepath.Join(dir, n), b); err != nil {
			return nil, err
		}
	}
	// A runtime with a kernel of its own has the agent hold the bounds
	// inside; the host cgroup is then its backstop (provider.Guest).
	cgroupLimit, pids := sb.MemoryBytes, sb.Pids
	guest := s.guest(sb)
	if guest != nil {
		cgroupLimit, pids = guest.HostBounds(sb.MemoryBytes, sb.Pids)
	}
	agentDir := sb.AgentDir
	if agentDir == "" {
		agentDir = s.agentDir
	}
	idJSON, err := json.Marshal(bootIdentity(sb))
	if err != nil {
		return nil, err
	}
	agentEnv := []string{proto.EnvToken + "=" + sb.Token, proto.EnvIdentity + "=" + string(idJSON)}
	if envlist.Has(sb.Env, "HOME") {
		// The runtime sets HOME (root's) when the spec does not: tell the
		// agent which HOME it holds, so a command run as a user gets that
		// user's home rather than root's.
		agentEnv = append(agentEnv, proto.EnvOwnHome+"=1")
	}
	spec := oci.Build(oci.Options{
		Rootfs: rootfsDir, Hostname: hostname, Env: sb.Env,
		AgentEnv: agentEnv,
		AgentDir: agentDir, Netns: nsPath, CgroupsPath: oci.CgroupsPath(sb.ID),
		MemoryLimit: cgroupLimit, CPUMillis: sb.CPUMillis, Pids: pids,
		ResolvConf: filepath.Join(dir, "resolv.conf"), Hosts: filepath.Join(dir, "hosts"), HostnameF: filepath.Join(dir, "hostname"),
		Devices: s.cfg.Images.Devices(sb.ImageDigest),
	})
	if guest != nil {
		guest.GuestSpec(spec, sb.MemoryBytes, sb.Pids)
	}
	return &provider.Instance{ID: sb.ID, Bundle: dir, Spec: spec, LogOut: filepath.Join(dir, "agent.log"), Log: s.cfg.Log}, nil
}

// guest is sb's runtime when it runs a kernel of its own, else nil.
func (s *Service) guest(sb *store.Sandbox) provider.Guest {
	g, _ := s.providers[sb.Provider].(provider.Guest)
	return g
}

// oomKills counts processes killed for memory in the running instance: by
// the host kernel (memory cgroup) and, on a guest kernel, by the agent's
// guard.
func (s *Service) oomKills(ctx context.Context, sb *store.Sandbox) int64 {
	return s.cgroupOOMKills(sb) + s.agentOOMKills(ctx, sb)
}

// cgroupOOMKills is the host kernel's OOM kill count in sb's cgroups, as
// its runtime counts them (gone once the runtime deletes the container).
func (s *Service) cgroupOOMKills(sb *store.Sandbox) int64 {
	if c, ok := s.providers[sb.Provider].(provider.OOMCounter); ok {
		return c.OOMKills(sb.ID)
	}
	return 0
}

// agentOOMKills is what the agent's OOM guard killed (a guest kernel's
// sandbox only: elsewhere the host kernel kills).
func (s *Service) agentOOMKills(ctx context.Context, sb *store.Sandbox) int64 {
	if s.guest(sb) == nil {
		return 0
	}
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if r, err := s.agentFor(sb).Call(cctx, proto.OpStats); err == nil {
		return r.OOMKills
	}
	return 0
}
