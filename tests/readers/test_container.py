from preflight.base.host import Host
from preflight.readers import container


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
