// Package runtime declares what the App reconciler asks of the thing that runs
// processes: make an app's desired release run, report what serves, and remove an
// app. Two implementations exist: runtime/local (containerd on this host, for a single
// node) and runtime/kube (Deployments and Services, for a cluster). The reconciler
// holds the single control loop; a runtime holds no loop of its own beyond what it
// needs to supervise processes.
//
// Endpoints: whatever serves an app's web process is published as the EndpointSlices
// of a Service named after the app, in the app's namespace (label
// kubernetes.io/service-name=<app>), with only ready backends. On a cluster
// Kubernetes writes them from the Deployment's pods; the local runtime writes them
// itself. The edge routes from those slices and nothing else.
//
// Images: a runtime that can remove the images it runs implements Images, so
// that pruned releases and deleted apps take their images with them:
// runtime/local from containerd's image store, runtime/kube from the registry
// the images were pushed to (when configured to delete there).
package runtime
