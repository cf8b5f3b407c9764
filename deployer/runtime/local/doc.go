// Package local is the single-node runtime: it runs an app's processes as
// containerd containers (runc) on this host and publishes the web instances as the
// app's EndpointSlices. It implements bex.co/bex/deployer/runtime.Runtime.
//
// Images (diskusage.go) measures and removes, for the gitserver's system:df and
// system:prune, the images bex built in the namespace, by RemoveImages' rules.
//
// What it owns:
//
//   - the containers labelled app.bex.co/runtime=local in its containerd namespace,
//     one per instance, named <namespace>-<app>-<process>-r<release>-<n>-<random>;
//   - the state file <state dir>/state.json: reserved ports (port → container) and
//     the release that serves each app;
//   - the instances' logs under <state dir>/logs/<namespace>/<app>/ (LogBytes
//     measures them for system:df);
//   - the Service <app> (headless, no selector) and the EndpointSlices labelled
//     endpointslice.kubernetes.io/managed-by=local.runtime.bex.co, owned by the App.
//   - the apps' volumes (volumes.go): ext4 images under <state dir>/volumes/<ns>/
//     <app>/, loop-mounted under /run/bex/volumes-<hash>/, and their backups and
//     restores (backup.go, Volumes, for the gitserver).
//
// Each instance runs in a network namespace of its own on the apps' CNI network
// (internal/machine/tenantnet; Config.Network "host" keeps the host's), kept at
// <state dir>/net/<id>/netns with the namespace's resolv.conf and hosts, its id
// and address in the container's labels. Namespaces are attached ahead of need, a
// pool of Config.NetworkPool, refilled once the instance that took one is ready;
// an instance's namespace is torn down (CNI DEL, unmount) after its container is
// deleted, and at start every namespace that no container uses is torn down.
// Each instance also gets its own PORT from the configured range. A port is reserved in the state file
// before the container exists, is checked with a bind on 127.0.0.1 before it is
// given out, is not reused at once (the search continues after the last port
// given), and is freed when the container is deleted.
//
// Endpoints: an EndpointSlice carries its ports for all its endpoints, and the
// instances' ports differ, so there is one EndpointSlice per ready web instance
// (named <app>-<port>), each with one endpoint, the instance's address, and one
// port "http"; the health and liveness checks dial the same address. On the host
// network the address is 127.0.0.1 and the addressType FQDN, not IPv4: the API
// server refuses loopback addresses in IPv4 and IPv6 slices ("may not be in the
// loopback range"), while "127.0.0.1" is a valid FQDN address that any dialer
// takes as the IP literal it is. A
// rollout writes the new slices first and deletes the old ones after, so the edge
// sees the new backends before the old ones leave; the old instances then keep
// running for the drain period before SIGTERM (SIGKILL after the stop timeout).
//
// What an instance runs is its gen: the release number and a hash of what reaches
// the container (image, commands, resolved env including Secret values, health
// check). A config change without a new release number therefore rolls out new
// instances like a release would. Replicas are not in the gen: scaling adds or
// removes instances of the same gen.
//
// Supervision: a goroutine per instance waits on its task and restarts it after
// an exit with exponential backoff (RestartBackoff doubling to RestartBackoffMax,
// reset after a run longer than the crash-loop window). CrashLoopRestarts exits
// within CrashLoopWindow make the instance crash-looping. A prober per task start
// marks the instance ready: a web instance when GET healthCheck.path on its PORT
// answers 2xx or 3xx (redirects are not followed), or when PORT accepts a TCP
// connection without a health check; other processes once running. Readiness is
// checked until the first success of each task start, not afterwards; an exited
// instance leaves the endpoints at once.
//
// A release that fails (image missing, crash loop, not healthy within the boot
// timeout) has its instances stopped while the serving release keeps its instances
// and endpoints. The failure is remembered for that release, config and scale, so
// Sync reports it again without retrying; a new release, a config change or a scale
// change tries again. The memory does not survive a restart of bex, which retries
// once.
//
// Adoption: New lists the containers labelled as this runtime's, rebuilds their
// instances from the labels (app, namespace, process, release, config hash, index,
// port, log file, restarts), reserves their ports, frees the ports of containers
// that are gone, watches the running tasks and restarts the others. Which release
// serves comes from the state file, so the first Sync after a restart finds the
// instances it wants already there and starts nothing.
//
// Confinement (security.go, oom.go): each instance runs in a user namespace
// whose ids 0..65535 are the app's own range of host ids (allocated per app in the
// state file, recorded on the container), with containerd's default seccomp
// profile, runtime.Capabilities, no_new_privs, a sysfs of its own network
// namespace read-only (sysfs.go: its own devices only) with the container's own
// cgroups over /sys/fs/cgroup, and the process type's memory, pids and CPU
// limits, its cgroup under the tenants' parent (cgroup.go), whose pids.max
// bounds all of them together. The rootfs is a snapshot of the image chowned into the range,
// made once per image and range. An exit after a kill by the memory limit
// (TaskOOM event, or the cgroup's oom_kill count) is reported as OOMKilled.
//
// Commands may use $(NAME) references to the instance's environment, expanded as
// the kubelet does ($$ is a literal $; unknown references stay as written). A
// config var whose Secret or key is missing makes Sync return an error naming it.
//
// Images (images.go): RemoveImages deletes the images of pruned releases from the
// namespace's image store, only names under the repository given, never a digest a
// container of the namespace was made from, each delete synchronous with
// containerd's garbage collection (content and snapshots go with it).
// RemoveRepository deletes every image named under the repository (an app was
// deleted), with the same rules.
package local
