// Package kube is the cluster runtime: it runs an App's processes as Kubernetes
// objects through a controller-runtime client, and reports their state from those
// objects alone.
//
// It owns, per App, in the App's namespace:
//
//   - one Deployment per process type, named "<app>-<process>", labelled
//     app.bex.co/app and app.bex.co/process (its selector) and carrying
//     app.bex.co/release on its pod template, controlled by the App (an owner
//     reference, so that deleting the App garbage-collects it on a cluster);
//   - a Service named "<app>" for the web process (port 80 → PORT), whose
//     EndpointSlices Kubernetes fills with the ready web pods; the edge routes from
//     those slices (see package runtime).
//   - one PersistentVolumeClaim per volume, "<app>-vol-<name>", labelled
//     app.bex.co/app and app.bex.co/volume, owned by the App (volumes.go); the
//     Deployments of the process types that mount one roll out by Recreate;
//   - one PodDisruptionBudget per process type of 2 or more instances (and no
//     volume), named like its Deployment, maxUnavailable 1: a node's drain (an
//     upgrade, a scale-down) evicts one instance at a time (disruption.go).
//
// Objects are written with server-side apply under one field manager: each Sync
// states the whole intent, fields the API server defaults stay the server's, and an
// unchanged intent is a no-op at the API server (no write, no watch event), which
// matters because the reconciler calls Sync again and again during a rollout.
//
// Kubernetes does the rolling: maxUnavailable 0 and a surge keep the old pods serving
// until the new ones pass their readiness probe, and the Deployment's progress
// deadline is the App's boot timeout. The package only reads the result: a process is
// ready when its Deployment has observed its spec and every replica is an available
// replica of the current template. Which release serves is remembered in a
// label on the web Deployment (app.bex.co/serving-release), written when a rollout
// is seen complete, because a Deployment keeps no record of which template was the
// last complete one.
//
// It also lists the pods of the release being synced (by app and release label,
// from the manager's cache): their restarts are the processes' Restarts, and a pod
// the kubelet reports in CrashLoopBackOff, or unable to pull its image, fails an
// unfinished rollout at once (CrashLoop, ImageNotFound, with the exit code or the
// kubelet's message), as the local runtime reports them, instead of a
// progress-deadline failure minutes later. A container whose last termination
// was OOMKilled and that is not ready again reports OOMKilled, and is counted.
//
// Every app container is confined as on the local runtime: resources from the
// process type's resources (memory request = limit; cpu request = limit when
// set), seccomp RuntimeDefault, capabilities dropped to runtime.Capabilities, no
// privilege escalation, and hostUsers: false unless Config.HostUsers.
//
// Images (images.go): with Config.RegistryDelete, RemoveImages and
// RemoveRepository delete manifests from the registry the image references name
// (OCI distribution API, go-containerregistry), in the app's repository only;
// the registry's garbage collection frees the blobs.
package kube
