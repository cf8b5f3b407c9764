package up

import "bex.co/bex/internal/machine/supervise"

// When the machine runs out of memory the kernel kills the process with the
// highest badness: its memory share plus oom_score_adj/1000 of the machine. The
// platform gets negative values and every tenant (an app's container, a build
// step) a positive one, so that a tenant using all the memory it may is the one
// killed, and the platform that restarts it keeps running.
//
//   - bex up itself: -999. It is small, and its death takes every child with it
//     (their parent-death signal).
//   - etcd, kube-apiserver, containerd: -999, as a Kubernetes node gives its
//     kubelet and container runtime. The API and the runtime are what everything
//     else needs; containerd's shims get -998 from containerd (its value plus one).
//   - the edge, the gitserver, the deployer: -900. Below the daemons they depend
//     on, far below any tenant.
//   - buildkitd: -500. It grows with the builds it runs; losing it fails the builds
//     in flight and nothing else, and it is restarted.
//   - tenants: TenantOOMScoreAdj, through containerd's runc wrapper
//     (daemons.Containerd.Runc): without it a container would inherit its shim's
//     -998 and be protected like the platform.
//
// Lowering a value needs CAP_SYS_RESOURCE; without it (bex up in a container that
// drops it) the platform keeps the value bex up was started with, and the tenants'
// positive value still puts them first.
var oomScoreAdj = map[string]int{
	"etcd":           -999,
	"kube-apiserver": -999,
	"containerd":     -999,
	"buildkitd":      -500,
	"deployer":       -900,
	"edge":           -900,
	"gitserver":      -900,
}

// upOOMScoreAdj is bex up's own.
const upOOMScoreAdj = -999

// TenantOOMScoreAdj is every container's: above any process of the host (0) and of
// the platform, the same for all tenants, so that among them the kernel picks the
// largest.
const TenantOOMScoreAdj = 500

// protect gives bex up its own oom_score_adj, before any child: they inherit it
// until the supervisor sets theirs.
func (p *Platform) protect() {
	if err := supervise.SetOOMScoreAdj(0, upOOMScoreAdj); err != nil && p.cfg.Log != nil {
		p.cfg.Log.Warn("bex up keeps its oom_score_adj (lowering it needs CAP_SYS_RESOURCE)", "err", err)
	}
}
