from preflight.base.host import Host
from preflight.readers.system import container


def test_the_runtimes_own_marks_say_container(tmp_path):
    (tmp_path / ".dockerenv").write_text("")
    assert container.detect(Host(tmp_path, environ={})) == "Docker (/.dockerenv)"
    podman = tmp_path / "p"
    (podman / "run").mkdir(parents=True)
    (podman / "run" / ".containerenv").write_text("engine=\"podman\"\n")
    assert container.detect(Host(podman, environ={})) == "Podman (/run/.containerenv)"


def test_a_pod_and_systemds_container_variable_say_so(tmp_path):
    assert "Kubernetes pod" in container.detect(Host(tmp_path, environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}))
    assert container.detect(Host(tmp_path, environ={"container": "lxc"})) == "a lxc container (container=lxc in the environment)"


def test_a_host_with_no_mark_is_no_container(tmp_path):
    (tmp_path / "run").mkdir()
    assert container.detect(Host(tmp_path, environ={"container": " ", "HOME": "/root"})) is None


def test_the_hosts_ipc_namespace_is_told_by_its_fixed_inode(tmp_path):
    import os
    import subprocess
    import sys

    here = container.host_ipc(Host())
    assert here == (os.stat("/proc/self/ns/ipc").st_ino == container.INIT_IPC_INO)
    assert container.host_ipc(Host(tmp_path, environ={})) is None  # a recorded tree has no /proc/self/ns: unknown
    if os.geteuid() == 0 and here:
        # A new IPC namespace, as a container without --ipc=host has: not the host's.
        code = "from preflight.base.host import Host; from preflight.readers.system import container; print(container.host_ipc(Host()))"
        done = subprocess.run(["unshare", "--ipc", sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == "False", done.stderr
