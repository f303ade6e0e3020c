"""The launch specs of the environment servers (tools/launch/k8s/env_servers.yaml, tools/launch/slurm/
env_servers.sbatch), read statically: they parse, run the server module with arguments its command line takes, keep
the secret out of their command lines (a k8s Secret; an exported variable), reach the servers inside the cluster
only (ClusterIP), and hand the servers' addresses to the run config's real field. (tests/tools/
slurm_env_servers_test.py runs the servers' job beside the trainer and actor specs on a private cluster.)"""

import pathlib
import re
import shlex
import subprocess

from absl.testing import absltest
import yaml

from c2jax.envs.service import server
from c2jax.services import rl_run_config

_LAUNCH = pathlib.Path(__file__).resolve().parents[2] / "tools" / "launch"
SERVER_MODULE = "c2jax.envs.service.server"


def _docs(name: str) -> list[dict]:
  return [d for d in yaml.safe_load_all((_LAUNCH / "k8s" / name).read_text()) if d]


def _containers(doc: dict) -> list[dict]:
  spec = doc.get("spec", {})
  return spec.get("template", {}).get("spec", {}).get("containers", [])


class K8sEnvServersTest(absltest.TestCase):

  def test_the_deployment_runs_the_server_behind_a_cluster_ip_service(self):
    docs = {d["kind"]: d for d in _docs("env_servers.yaml")}
    self.assertEqual(set(docs), {"Service", "Deployment"})
    service, deployment = docs["Service"], docs["Deployment"]
    self.assertEqual(service["spec"]["type"], "ClusterIP")
    self.assertEqual(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    (container,) = _containers(deployment)
    self.assertEqual(container["command"], ["python", "-m", SERVER_MODULE])
    args = server.arg_parser().parse_args(container["args"])  # every argument is one the server takes
    port = int(args.address.rpartition(":")[2])
    self.assertEqual(service["spec"]["ports"][0]["targetPort"], port)
    self.assertEqual(container["ports"][0]["containerPort"], port)
    self.assertEqual(container["readinessProbe"]["tcpSocket"]["port"], port)
    # The secret comes from a k8s Secret, named by its variable; never a value in the spec.
    self.assertIn({"secretRef": {"name": "c2jax-env"}}, container["envFrom"])
    self.assertNotIn(args.secret_env, {e["name"] for e in container.get("env", [])})

  def test_the_clients_read_the_same_secret(self):
    for name in ("trainer.yaml", "actors.yaml"):
      for doc in _docs(name):
        for container in _containers(doc):
          self.assertIn({"secretRef": {"name": "c2jax-env", "optional": True}}, container.get("envFrom", []),
                        f"{name}: {container['name']}")


class SlurmEnvServersTest(absltest.TestCase):

  def test_the_job_parses_and_runs_the_server(self):
    path = _LAUNCH / "slurm" / "env_servers.sbatch"
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    self.assertIn("#SBATCH --gpus-per-node=0", text)  # CPU nodes
    (command,) = re.findall(r"python -m " + re.escape(SERVER_MODULE) + r" ((?:[^\n]|\\\n)*?)2>&1", text)
    # The task's shell values, as one node's task expands them.
    values = {"$address": "10.0.0.7:7071", "$ENV_SECRET_VAR": "C2JAX_ENV_SECRET", "$MAX_EPISODES": "16"}
    args = shlex.split(command.replace("\\\n", " "))
    args = [re.sub(r"\$\w+", lambda m: values[m.group(0)], a) for a in args]
    parsed = server.arg_parser().parse_args(args)
    self.assertEqual((parsed.address, parsed.secret_env, parsed.max_episodes),
                     ("10.0.0.7:7071", "C2JAX_ENV_SECRET", 16))
    self.assertNotIn("token_hex", text)  # the secret is the user's, exported; the spec neither makes nor prints it

  def test_the_trainer_names_the_servers_in_the_run_config(self):
    path = _LAUNCH / "slurm" / "trainer.sbatch"
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    (override,) = re.findall(r"--config\.(env_service\.\w+)=", text)
    section, field = override.split(".")
    self.assertIn(field, rl_run_config.defaults()[section])  # a real field: rl_main would refuse another
    self.assertIn('scancel "$ENV_JOB"', text)


if __name__ == "__main__":
  absltest.main()
