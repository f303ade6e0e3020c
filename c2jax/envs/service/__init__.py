"""The environment service (report section 6: environments as a service of their own, on CPU hosts, reached by the
actors over the network); docs/design/env_service.md says why and how.

  wire.py     what crosses between client and server: the methods, the metadata, JSON payloads and their checks
  suites.py   a task suite named as plain data (its registry name and fields), and the server's cache of them
  config.py   `EnvServiceConfig`: the servers, the secret's variable, deadlines, TLS
  server.py   the gRPC server process hosting episodes (`python -m c2jax.envs.service.server`)
  client.py   `EnvServerPool` and `RemoteEnv`, an `AgentEnv` over a server
"""
