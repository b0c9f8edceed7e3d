-- job_submit.lua for cluster demo: rendered by slonk from cluster.yaml. Do not
-- edit. slurmctld runs it (JobSubmitPlugins=lua) only while the cluster has no mail relay
-- (values mail.relay): a job that asks for mail is accepted, and its user told that none
-- will come, at submission rather than never.
local NO_MAIL = "this cluster sends no mail (no relay is set up): --mail-type is accepted, " ..
   "and no message will come"
local NO_VAL16 = slurm.NO_VAL16 or 65534

local function tell_if_mail(job_desc)
   local mail = job_desc.mail_type
   if mail ~= nil and mail ~= 0 and mail ~= NO_VAL16 then
      slurm.log_user(NO_MAIL)
   end
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   tell_if_mail(job_desc)
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   tell_if_mail(job_desc)
   return slurm.SUCCESS
end
