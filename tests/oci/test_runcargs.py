import pytest

from nvct.oci.runcargs import parse


def test_docker_create_command_line():
    argv = ["--root", "/run/docker/runtime-runc/moby", "--log", "/b/log.json", "--log-format", "json",
            "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "abc123"]
    args = parse(argv)
    assert (args.subcommand, args.bundle, args.container_id) == ("create", "/b", "abc123")
    assert (args.log, args.log_format) == ("/b/log.json", "json")


def test_equals_forms_and_short_bundle_flag():
    args = parse(["--root=/r", "--systemd-cgroup", "--debug", "create", "-b", "/x", "--console-socket", "/s", "id"])
    assert (args.subcommand, args.bundle, args.container_id) == ("create", "/x", "id")
    assert parse(["create", "--bundle=/y", "id"]).bundle == "/y"


def test_create_without_bundle_uses_cwd():
    assert parse(["create", "id"], cwd="/some/bundle").bundle == "/some/bundle"


@pytest.mark.parametrize("argv, sub", [
    (["--version"], None), (["start", "id"], "start"), (["--root", "/r", "delete", "--force", "id"], "delete"),
    ([], None),
])
def test_other_subcommands(argv, sub):
    args = parse(argv)
    assert args.subcommand == sub
    assert args.bundle is None


def test_one_dash_long_flags_as_runc_takes_them():
    """runc parses flags with Go's flag package: -root and --root, -b, --b and -bundle are one flag each."""
    args = parse(["-root", "/r", "-log-format", "json", "-log=/l", "create", "-bundle", "/b", "-pid-file", "/p", "id"])
    assert (args.subcommand, args.bundle, args.container_id) == ("create", "/b", "id")
    assert (args.log, args.log_format) == ("/l", "json")
    assert parse(["create", "--b", "/x", "id"]).bundle == "/x"
    assert parse(["run", "-bundle=/y", "id"]).bundle == "/y"


@pytest.mark.parametrize("flag", [["--pid-file", "/run/c1.pid"], ["--pid-file=/run/c1.pid"],
                                  ["-pid-file", "/run/c1.pid"]])
def test_the_pid_file_and_the_global_options_the_shim_passes_on(flag):
    args = parse(["--root", "/run/runc", "--log-format=json", "create", "--bundle", "/b", *flag, "c1"])
    assert (args.pid_file, args.options, args.container_id) == ("/run/c1.pid", ("--root", "/run/runc",
                                                                                "--log-format=json"), "c1")
    assert parse(["run", "--bundle", "/b", "c1"]).pid_file is None
